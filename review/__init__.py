"""The analysts' review console (`fraud-review`): every flagged decision becomes a case, every
verdict a label.

The data flow, one module each: `ingest` reads the decisions (and the transactions they lack)
into the `cases` store; `web` serves the queue and the JSON API behind `auth`; `verdicts` turns
an analyst's verdict into a record of the labels topic; `metrics` exports the queue's state.
"""

"""The features worker (`fraud-features`, faust-streaming): per-terminal risk from labels.

It counts every transaction and every confirmed fraud on its terminal's day, in a faust table
with a changelog topic, and publishes each terminal's risk over the 1-, 7- and 30-day windows
(with the handbook's 7-day delay) to the compacted `terminal-risk` topic that the scorer reads.
Off the scoring path: the scorer never waits for it. Layer: beside `stream`; it imports
contracts, scorer and deadletter-level contracts only.
"""

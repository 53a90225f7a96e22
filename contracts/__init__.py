"""The contracts every other package builds on: errors, message formats, dead-letter headers,
offset bookkeeping and Kafka error translation. Imports no other package of the project."""

"""The wire formats every other package builds on: the messages (transactions, decisions,
labels, terminal risk, card frauds, the worker's progress), the dead-letter headers, the input
and output formats with their schemas, and the offset contract. Imports only `plumbing`."""

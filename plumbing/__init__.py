"""What every command's process needs, below everything else: the error root, settings read from
flags and FRAUD_* variables, logging, the health and metrics server, Kafka client settings and
error translation, topic administration, bounded file reads and the Prometheus text reader.
Imports no other package of the project."""

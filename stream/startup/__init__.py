"""Start-up of `fraud-scorer`: the command line (`cli`), the settings and their checks
(`options`, `config`), and the wiring of a replica's parts (`wiring`, `kafka_clients`,
`topics`). One process is one replica; more cores take more replicas (docs/architecture.md,
"One process per pod"). The pipeline they start is the rest of `stream/`, from
`stream/service.py` on."""

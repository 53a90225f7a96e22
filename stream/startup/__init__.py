"""Start-up of `fraud-scorer`: the command line (`cli`), the settings and their checks
(`options`, `config`), the supervisor of several processes (`supervisor`, `child_health`), and
the wiring of a replica's parts (`wiring`, `kafka_clients`, `topics`). The pipeline they start
is the rest of `stream/`, from `stream/service.py` on."""

"""What every long-running command does first: read its settings from flags and environment,
refuse bad configuration in one line, and set up its logs."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import TypeVar

from plumbing.environment import check_environment
from plumbing.errors import ConfigurationError
from plumbing.kafka_settings import redact_urls
from plumbing.logs import configure_logging
from plumbing.settings import ServiceSettings

S = TypeVar("S", bound=ServiceSettings)


def configured(command: str, kind: type[S], args: argparse.Namespace) -> S | None:
    """`command`'s settings from its parsed flags, then the environment, with its logs set up
    and the environment's warnings logged. None after printing the configuration error on
    stderr (a misspelt `FRAUD_*` variable, a bad value, a librdkafka properties file that cannot
    be read): the caller exits with status 2, before any connection is made."""
    try:
        warnings = check_environment(command)
        config = kind.from_args(args)
        config.kafka_settings()
    except ConfigurationError as exc:
        print(f"{command}: configuration error: {redact_urls(str(exc))}", file=sys.stderr)
        return None
    configure_logging(config.log_level, config.log_format)
    for warning in warnings:
        logging.getLogger(command).warning("%s", warning)
    return config

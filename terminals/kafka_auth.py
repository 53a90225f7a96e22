"""The project's librdkafka-style security settings mapped onto faust's Kafka client (aiokafka).

Every command reads extra Kafka settings the same way (`FRAUD_KAFKA_CONFIG_FILE`, overridden by
`FRAUD_KAFKA_OPTIONS` or `-X`; `plumbing/kafka_settings.py`). The scorer hands them to
librdkafka as they are; faust speaks aiokafka, so this module translates the security subset:

    security.protocol                  PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL
    sasl.mechanism (sasl.mechanisms)   PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512
    sasl.username, sasl.password
    ssl.ca.location                    CA bundle (PEM file) to verify the brokers with
    ssl.certificate.location, ssl.key.location, ssl.key.password   client certificate (mTLS)
    ssl.endpoint.identification.algorithm   https (default: check the host name) or none
    enable.ssl.certificate.verification     true (default) or false

Anything else under `sasl.` or `ssl.` (GSSAPI, OAUTHBEARER, PKCS#12 keystores, inline PEM …)
stops the worker with a ConfigurationError naming the key: a security setting is never dropped
silently. Other keys (client tuning for librdkafka) are not applied and are named in one warning.
No message here repeats a value.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from typing import NamedTuple

from faust.auth import SASLCredentials, SSLCredentials
from faust.types.auth import CredentialsT

from plumbing.errors import ConfigurationError

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
SUPPORTED_KEYS = frozenset(
    {
        "security.protocol",
        "sasl.mechanism",
        "sasl.mechanisms",
        "sasl.username",
        "sasl.password",
        "ssl.ca.location",
        "ssl.certificate.location",
        "ssl.key.location",
        "ssl.key.password",
        "ssl.endpoint.identification.algorithm",
        "enable.ssl.certificate.verification",
    }
)


class FaustKafkaAuth(NamedTuple):
    """What faust's app takes: credentials (None for PLAINTEXT), and the keys not applied."""

    credentials: CredentialsT | None
    ignored: tuple[str, ...]


def faust_kafka_auth(settings: Mapping[str, str]) -> FaustKafkaAuth:
    """Translate librdkafka security settings into faust `broker_credentials`.

    Raises ConfigurationError for an unsupported protocol, mechanism or security key, a missing
    SASL username or password, or a certificate file that cannot be loaded.
    """
    unsupported = sorted(
        key for key in settings if key.startswith(("sasl.", "ssl.")) and key not in SUPPORTED_KEYS
    )
    if unsupported:
        raise ConfigurationError(
            f"fraud-features cannot apply the Kafka security settings {unsupported}: it maps only "
            f"{sorted(SUPPORTED_KEYS)} onto its client (aiokafka)"
        )
    ignored = tuple(sorted(key for key in settings if key not in SUPPORTED_KEYS))
    protocol = settings.get("security.protocol", "PLAINTEXT").upper()
    if protocol not in PROTOCOLS:
        raise ConfigurationError(f"security.protocol must be one of {list(PROTOCOLS)}")
    context = _ssl_context(settings) if protocol in ("SSL", "SASL_SSL") else None
    if protocol == "PLAINTEXT":
        return FaustKafkaAuth(None, ignored)
    if protocol == "SSL":
        return FaustKafkaAuth(SSLCredentials(context), ignored)
    mechanism = settings.get("sasl.mechanism", settings.get("sasl.mechanisms", "PLAIN")).upper()
    if mechanism not in MECHANISMS:
        raise ConfigurationError(
            f"sasl.mechanism must be one of {list(MECHANISMS)} for fraud-features"
        )
    username, password = settings.get("sasl.username"), settings.get("sasl.password")
    if not username or password is None:
        raise ConfigurationError(f"{protocol} needs sasl.username and sasl.password")
    credentials = SASLCredentials(
        username=username, password=password, ssl_context=context, mechanism=mechanism
    )
    return FaustKafkaAuth(credentials, ignored)


def _ssl_context(settings: Mapping[str, str]) -> ssl.SSLContext:
    try:
        context = ssl.create_default_context(cafile=settings.get("ssl.ca.location") or None)
        certificate = settings.get("ssl.certificate.location")
        if certificate:
            context.load_cert_chain(
                certificate,
                keyfile=settings.get("ssl.key.location") or None,
                password=settings.get("ssl.key.password") or None,
            )
    except (OSError, ssl.SSLError) as exc:
        # The exception names a file or an OpenSSL reason, never a password.
        raise ConfigurationError(f"cannot load the SSL files for Kafka: {exc}") from exc
    identification = settings.get("ssl.endpoint.identification.algorithm", "https").lower()
    if identification not in ("https", "none", ""):
        raise ConfigurationError("ssl.endpoint.identification.algorithm must be https or none")
    verify = settings.get("enable.ssl.certificate.verification", "true").lower()
    if verify not in ("true", "false"):
        raise ConfigurationError("enable.ssl.certificate.verification must be true or false")
    if identification != "https" or verify == "false":
        context.check_hostname = False
    if verify == "false":
        context.verify_mode = ssl.CERT_NONE
    return context

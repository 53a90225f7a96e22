"""librdkafka settings as users give them: `-X KEY=VALUE`, `FRAUD_KAFKA_OPTIONS`, and a
properties file (`FRAUD_KAFKA_CONFIG_FILE`), the place for secrets.

Every command reads them the same way (`KafkaSettings` in `plumbing/settings.py`), and logs
them only through `redact`: a value is shown only for keys known to hold no secret, so a new or
misspelt secret setting is hidden rather than leaked. No error message here repeats a value.

`redact_urls` masks the credentials a URL may carry (`scheme://user:password@host`, a bare
`user:password@host`, a `?token=` in its query): every command's log lines pass through it
(`plumbing/logs.py`), and so does each error and dead letter that may quote a URL.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from plumbing.bounded_read import read_bounded
from plumbing.errors import ConfigurationError

#: Keys whose values are safe to log: names, paths, protocols and tuning. Anything else
#: (passwords, tokens, OAuth configurations, keys, JAAS configs, future secrets) is masked.
SAFE_KEYS = frozenset(
    {
        "acks",
        "auto.commit.interval.ms",
        "auto.offset.reset",
        "batch.num.messages",
        "batch.size",
        "client.dns.lookup",
        "client.id",
        "client.rack",
        "compression.type",
        "debug",
        "enable.idempotence",
        "enable.ssl.certificate.verification",
        "fetch.max.bytes",
        "fetch.min.bytes",
        "fetch.queue.backoff.ms",
        "fetch.wait.max.ms",
        "isolation.level",
        "linger.ms",
        "max.in.flight.requests.per.connection",
        "max.partition.fetch.bytes",
        "max.poll.interval.ms",
        "message.max.bytes",
        "message.timeout.ms",
        "partition.assignment.strategy",
        "queue.buffering.max.kbytes",
        "queue.buffering.max.messages",
        "queued.max.messages.kbytes",
        "queued.min.messages",
        "reconnect.backoff.max.ms",
        "reconnect.backoff.ms",
        "request.timeout.ms",
        "retry.backoff.ms",
        "sasl.kerberos.service.name",
        "sasl.mechanism",
        "sasl.mechanisms",
        "sasl.oauthbearer.method",
        "sasl.oauthbearer.scope",
        "sasl.oauthbearer.token.endpoint.url",
        "security.protocol",
        "session.timeout.ms",
        "socket.keepalive.enable",
        "socket.timeout.ms",
        "ssl.ca.location",
        "ssl.certificate.location",
        "ssl.endpoint.identification.algorithm",
        "ssl.key.location",
        "statistics.interval.ms",
        "topic.metadata.refresh.interval.ms",
        "transaction.timeout.ms",
        "transactional.id",
    }
)
MASK = "***"

#: A comma in FRAUD_KAFKA_OPTIONS separates settings only where a librdkafka setting name and
#: `=` follow (names are dotted, but for these few), so a value such as a password may itself
#: hold commas, and even `,word=`.
_DOTLESS_NAMES = ("acks", "debug", "partitioner")
_SETTING_START = re.compile(
    r",(?=\s*(?:[a-z0-9_]+(?:\.[a-z0-9_]+)+|" + "|".join(_DOTLESS_NAMES) + r")\s*=)"
)


def parse_kafka_options(items: Iterable[str]) -> dict[str, str]:
    """Parse KEY=VALUE items (`-X`, repeatable) into librdkafka settings.

    Raises ConfigurationError for an item without `=`; the message names the item's position,
    never its text (which may be a secret).
    """
    options: dict[str, str] = {}
    for number, item in enumerate(items, start=1):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigurationError(
                f"kafka option #{number} must look like KEY=VALUE (its text is not shown: "
                "it may hold a secret)"
            )
        options[key.strip()] = value.strip()
    return options


def split_kafka_options(text: str) -> list[str]:
    """The KEY=VALUE items of FRAUD_KAFKA_OPTIONS (`k=v,k=v`)."""
    return _SETTING_START.split(text) if text.strip() else []


#: A librdkafka properties file holds a few dozen settings; one past this many bytes is refused
#: before it is read (a path to a device or a log by mistake).
MAX_CONFIG_FILE_BYTES = 1 << 20


def read_kafka_config_file(path: Path) -> dict[str, str]:
    """librdkafka settings from a properties file: one `key=value` per line, blank lines and
    lines starting with `#` or `!` ignored, whitespace around key and value stripped."""
    try:
        text = read_bounded(path, MAX_CONFIG_FILE_BYTES, f"kafka config file {str(path)!r}").decode(
            "utf-8"
        )
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigurationError(f"cannot read kafka config file {str(path)!r}: {exc}") from exc
    settings: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped[0] in "#!":
            continue
        key, sep, value = stripped.partition("=")
        if not sep or not key.strip():
            raise ConfigurationError(
                f"kafka config file {str(path)!r}, line {number}: expected key=value"
            )
        settings[key.strip()] = value.strip()
    return settings


def redact(settings: Mapping[str, object]) -> dict[str, object]:
    """Settings as they may be logged: values of keys not known to be safe are masked, and the
    credentials of any URL in the others (an endpoint URL is safe to show, its password not)."""
    return {
        k: ((redact_urls(v) if isinstance(v, str) else v) if k in SAFE_KEYS else MASK)
        for k, v in settings.items()
    }


#: Characters that end a URL's authority, or the text around it: the userinfo lies before the
#: authority's last `@` (an unencoded `@` in a password is common enough to allow).
_NOT_AUTHORITY = r"""\s/?#"'<>"""
#: The longest user name, password and scheme the patterns look for. Every quantifier is
#: bounded, so each place a match may start costs at most this much: the work is linear in the
#: text's length, whatever a hostile text holds (an unbounded `[^…]*@` tried from each of
#: 16,000 starts took 4.4 s on a 48 KB line). A longer credential is not masked.
MAX_USERINFO_CHARS = 1_024
_MAX_SCHEME_CHARS = 32
#: `scheme://userinfo@`: a user name alone is userinfo too (a token is often sent as one).
_SCHEME_USERINFO = re.compile(
    rf"(?<![A-Za-z0-9+.-])([A-Za-z][A-Za-z0-9+.-]{{0,{_MAX_SCHEME_CHARS}}}://)"
    rf"[^{_NOT_AUTHORITY}]{{1,{MAX_USERINFO_CHARS}}}@"
)
#: `user:password@host` without a scheme (a bootstrap server list), where a token starts: a
#: colon is required, so an e-mail address is left alone; `models:/name@alias` has a slash.
_BARE_USERINFO = re.compile(
    rf"(?<![^\s,;=(\['\"])[^{_NOT_AUTHORITY}:,;=()\[\]]{{1,{MAX_USERINFO_CHARS}}}:"
    rf"[^{_NOT_AUTHORITY}]{{0,{MAX_USERINFO_CHARS}}}@(?=[\w\[])"
)
#: Query parameters that carry a secret in the URL itself.
_SECRET_QUERY = re.compile(
    r"([?&](?:access_token|api_key|apikey|password|secret|sig|signature|token)=)[^&#\s\"'<>]+",
    re.IGNORECASE,
)


def redact_urls(text: str) -> str:
    """`text` with the credentials of every URL in it masked: the userinfo (`user:password@`,
    or `user@`, with a scheme; `user:password@` without one) becomes `***@`, and the value of a
    `token`, `access_token`, `password`, `secret`, `api_key` or `sig` query parameter `***`.
    Hosts, ports, IPv6 literals and paths stay, so the line still says where. Linear in the
    text's length (`MAX_USERINFO_CHARS`)."""
    if "@" in text:
        text = _SCHEME_USERINFO.sub(rf"\1{MASK}@", text)
        text = _BARE_USERINFO.sub(f"{MASK}@", text)
    if "=" in text:
        text = _SECRET_QUERY.sub(rf"\1{MASK}", text)
    return text


def redacted_prefix(text: str, limit: int) -> str:
    """The first `limit` characters of `text`, redacted as `redact_urls` does, for a field
    bounded in length: only the prefix is read (a credential that starts in it ends within
    `MAX_USERINFO_CHARS` more), so a long hostile text costs no more than a short one."""
    return redact_urls(text[: limit + 2 * MAX_USERINFO_CHARS])[:limit]


#: Environment variables every command reads its extra librdkafka settings from.
OPTIONS_ENV = "FRAUD_KAFKA_OPTIONS"
CONFIG_FILE_ENV = "FRAUD_KAFKA_CONFIG_FILE"

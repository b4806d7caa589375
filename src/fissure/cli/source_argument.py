"""`fissure run --source`: a directory of files, or a URL naming another of Spark's streaming sources.

    --source logs/                                        new files in a directory (--format, --schema, ...)
    --source 'rate://?rowsPerSecond=1000&numPartitions=2' Spark's rate source: timestamp, value
    --source socket://localhost:9999                      lines of text from a TCP server: value
    --source 'kafka://b1:9092,b2:9092/events?startingOffsets=earliest'
                                                          Kafka topics (comma-separated); options as given
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qsl, urlsplit

from fissure.cli import UsageError

SCHEMES = ("rate", "socket", "kafka")
RATE_OPTIONS = {"rowsPerSecond": "rows_per_second", "numPartitions": "partitions"}
FILE_ONLY_FLAGS = ("format", "schema", "files_per_batch", "kb_per_batch", "all_per_batch")


@dataclass(frozen=True)
class SourceURL:
    """A `--source` URL taken apart: which source, where, and its options."""

    scheme: str
    location: str  # socket: host:port; kafka: the bootstrap servers; rate: empty
    path: str  # kafka: the topics; otherwise empty
    options: tuple[tuple[str, str], ...]

    @property
    def endless(self) -> bool:
        """The source never runs out (rate, socket): a run ends by --max-batches, --timeout or ^C."""
        return self.scheme in ("rate", "socket")

    @property
    def replayable(self) -> bool:
        """A restart on the checkpoint reads the same records again (not a socket's lines)."""
        return self.scheme != "socket"


def parse_source_url(text: str) -> SourceURL | None:
    """The URL `text` names (None: `text` is a directory path); a usage error for a URL fissure
    does not read."""
    if "://" not in text:
        return None
    parts = urlsplit(text)
    if parts.scheme not in SCHEMES:
        raise UsageError(f"--source {text!r}: unknown source {parts.scheme!r}; give a directory or a URL of "
                         f"{', '.join(scheme + '://' for scheme in SCHEMES)}")
    try:
        options = tuple(parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query)))
    except ValueError:
        raise UsageError(f"--source {text!r}: its options must be name=value pairs joined by '&'") from None
    return SourceURL(parts.scheme, parts.netloc, parts.path.strip("/"), options)


def source_of(url: SourceURL, text: str):
    """The fissure source a parsed `--source` URL describes."""
    from fissure.spark.io.sources import KafkaSource, RateSource, SocketSource

    where = f"--source {text!r}"
    options = dict(url.options)
    if url.scheme == "rate":
        if url.location or url.path:
            raise UsageError(f"{where}: the rate source takes only options: rate://?rowsPerSecond=N&numPartitions=N")
        unknown = sorted(set(options) - set(RATE_OPTIONS))
        if unknown:
            raise UsageError(f"{where}: the rate source has no option {', '.join(unknown)}; "
                             f"its options are {', '.join(RATE_OPTIONS)}")
        values = {}
        for name, value in options.items():
            if not value.isdigit() or int(value) < 1:
                raise UsageError(f"{where}: {name} must be a positive integer, got {value!r}")
            values[RATE_OPTIONS[name]] = int(value)
        return RateSource(**values)
    if url.scheme == "socket":
        parts = urlsplit(text)
        try:
            port = parts.port
        except ValueError:
            port = None
        if not parts.hostname or port is None or url.path or options:
            raise UsageError(f"{where}: a socket source is socket://HOST:PORT, e.g. socket://localhost:9999")
        return SocketSource(parts.hostname, port)
    if not url.location or not url.path:
        raise UsageError(f"{where}: a Kafka source is kafka://BROKER:PORT[,BROKER:PORT...]/TOPIC[,TOPIC...]"
                         f"[?option=value&...], e.g. kafka://localhost:9092/events")
    return KafkaSource(url.location, url.path, options)


def refuse_file_flags(args, text: str) -> None:
    """The flags that describe a directory's files, given with another source: a usage error."""
    given = [name for name in FILE_ONLY_FLAGS if getattr(args, name, None) not in (None, False)]
    if given:
        flags = ", ".join("--" + name.replace("_", "-") for name in given)
        raise UsageError(f"{flags} describe{'s' if len(given) == 1 else ''} a directory of files; "
                         f"--source {text!r} is not one")

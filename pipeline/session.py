"""What the jobs share: the Spark session they run in and the click options that choose it
and the pylog cluster.

A job started from the command line creates its own session (local[*] unless --master names a
cluster; --conf passes any Spark setting) and stops it at the end. Called inside a process that
already has an active session (a notebook, the pyspark shell, a test), it runs in that session
and leaves it running. Executors import `pipeline` and `broker`: on a cluster, install pylog
with its pipeline extra on every node, as on the driver.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Final, TypeVar

import click
from pyspark.sql import SparkSession

from broker.security import ClientKeys, KeyFileError
from pipeline.source import register

log = logging.getLogger(__name__)

DEFAULT_BROKER: Final = "tcp://127.0.0.1:9092"
DEFAULT_MASTER: Final = "local[*]"

F = TypeVar("F", bound=Callable[..., object])


@contextlib.contextmanager
def job_session(
    app_name: str, master: str | None = None, conf: Sequence[tuple[str, str]] = ()
) -> Iterator[SparkSession]:
    """The session a job runs in, with format("pylog") registered (see the module doc)."""
    active = SparkSession.getActiveSession()
    if active is not None:
        if master is not None or conf:
            log.warning("running in the active Spark session: --master and --conf are ignored")
        register(active)
        yield active
        return
    builder = SparkSession.builder.appName(app_name).master(master or DEFAULT_MASTER)
    builder = builder.config("spark.ui.showConsoleProgress", "false")  # the job logs its own
    if (master or DEFAULT_MASTER).startswith("local"):
        # A local Spark listens on loopback only (by default it binds the address its host name
        # resolves to, or the first interface's, and fails where the name does not resolve).
        for key in ("spark.driver.host", "spark.driver.bindAddress"):
            builder = builder.config(key, "127.0.0.1")
    for key, value in conf:
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    try:
        register(spark)
        yield spark
    finally:
        spark.stop()


_PYLOG_ERROR: Final = re.compile(r"^((?:pipeline|broker)\.errors\.\w+: .*)$", re.MULTILINE)


def failure_message(error: Exception) -> str:
    """What to tell the user about a failed job: the pylog error behind a Spark failure (the
    last one named in Spark's message, which holds the Python traceback of the task) or else
    the error's own message."""
    text = str(error)
    found = _PYLOG_ERROR.findall(text)
    return found[-1] if found else text


def show_progress(job: str) -> None:
    """Log the pipeline's progress lines (INFO) to stderr, and only warnings of the rest."""
    logging.basicConfig(level=logging.WARNING, format=f"%(asctime)s {job}: %(message)s")
    logging.getLogger("pipeline").setLevel(logging.INFO)


def cluster_options(
    broker: str | None,
    zookeeper: str | None,
    key_file: str | None = None,
    broker_key: str | None = None,
    prefix: str = "",
) -> dict[str, str]:
    """A cluster's options from --broker / --zookeeper (the default broker when
    neither is given), and keyFile and brokerKey from --key-file and --broker-key, whose files
    are checked here (a usage error, before Spark starts). The errors name the options with
    `prefix` after the dashes: "mirror-" for the audit's --mirror-broker and its kin."""
    if broker and zookeeper:
        raise click.UsageError(f"give --{prefix}broker or --{prefix}zookeeper, not both")
    options = (
        {"zookeeper.connect": zookeeper} if zookeeper else {"broker": broker or DEFAULT_BROKER}
    )
    if bool(key_file) != bool(broker_key):
        raise click.UsageError(
            f"--{prefix}key-file and --{prefix}broker-key go together: give both, or neither"
        )
    if not key_file or not broker_key:
        return options
    try:
        ClientKeys.load(key_file, broker_key)
    except KeyFileError as error:
        raise click.UsageError(str(error)) from None
    return {**options, "keyFile": key_file, "brokerKey": broker_key}


def _key_value(
    _context: click.Context, _parameter: click.Parameter, values: Sequence[str]
) -> list[tuple[str, str]]:
    pairs = []
    for value in values:
        key, sep, setting = value.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{value!r}: use KEY=VALUE")
        pairs.append((key, setting))
    return pairs


def job_options(command: F) -> F:
    """--broker, --zookeeper, --key-file, --broker-key, --master and --conf, for every job."""
    decorators = [
        click.option(
            "--broker",
            envvar="PYLOG_BROKER",
            help=f"A broker of the cluster, tcp://HOST:PORT (env PYLOG_BROKER; default "
            f"{DEFAULT_BROKER}).",
        ),
        click.option(
            "--zookeeper",
            help="Find the cluster in ZooKeeper instead: HOST:PORT[,HOST:PORT][/CHROOT] "
            "(chroot /pylog by default).",
        ),
        click.option(
            "--key-file",
            envvar="PYLOG_KEY_FILE",
            metavar="PATH",
            help="This client's secret key file (NAME.key_secret, mode 0600), for brokers "
            "serving CurveZMQ (env PYLOG_KEY_FILE); with --broker-key. Read here, on the "
            "driver: the executors get the keys with their tasks.",
        ),
        click.option(
            "--broker-key",
            envvar="PYLOG_BROKER_KEY",
            metavar="KEY|PATH",
            help="The brokers' public key, 40 Z85 characters or the path of its .key file "
            "(env PYLOG_BROKER_KEY); with --key-file.",
        ),
        click.option(
            "--master",
            help=f"Spark master URL (default {DEFAULT_MASTER}: local Spark), e.g. "
            "spark://HOST:7077 or yarn.",
        ),
        click.option(
            "--conf",
            "conf",
            multiple=True,
            callback=_key_value,
            metavar="KEY=VALUE",
            help="A Spark setting; repeat for more.",
        ),
    ]
    for decorator in reversed(decorators):
        command = decorator(command)
    return command

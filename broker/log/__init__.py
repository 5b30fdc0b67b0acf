"""Storage: the message format, segments and partition logs. No network in here."""

from broker.log.config import LogConfig
from broker.log.local_log import LogStatistics
from broker.log.message import Message, encode_message, iter_messages, validate_message_set
from broker.log.partition import PartitionLog
from broker.log.recovery import RecoveryReport

__all__ = [
    "LogConfig",
    "LogStatistics",
    "Message",
    "PartitionLog",
    "RecoveryReport",
    "encode_message",
    "iter_messages",
    "validate_message_set",
]

"""Topic names (the rules every request that names a topic is checked by) and topic settings as
the wire spells them."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

from broker.errors import (
    InvalidTopic,
)
from broker.log.config import SettingValue
from broker.protocol.apis import MAX_TOPIC_LENGTH

# -- topic names and settings ------------------------------------------------------------------

_TOPIC_NAME: Final = re.compile(r"[A-Za-z0-9._-]+")
_TOPIC_CHARACTER: Final = re.compile(r"[A-Za-z0-9._-]")


_checked_topics: set[str] = set()
_CHECKED_TOPICS_MAX: Final = 100_000


def check_topic_name(topic: str) -> None:
    """Raise InvalidTopic unless `topic` is 1-249 characters of A-Z a-z 0-9 . _ - and is
    neither "." nor ".." (a topic name becomes a directory name). Names found good are
    remembered (up to _CHECKED_TOPICS_MAX): every routed request checks its topic."""
    if topic in _checked_topics:
        return
    if _TOPIC_NAME.fullmatch(topic) and len(topic) <= MAX_TOPIC_LENGTH:
        if topic not in (".", "..") and len(_checked_topics) < _CHECKED_TOPICS_MAX:
            _checked_topics.add(topic)
        if topic in (".", ".."):
            raise InvalidTopic(f"topic name {topic!r} is not allowed: it names a directory")
        return
    if not topic:
        raise InvalidTopic("topic name is empty: it needs 1 to 249 characters")
    if len(topic) > MAX_TOPIC_LENGTH:
        raise InvalidTopic(
            f"topic name of {len(topic)} characters is over the limit of {MAX_TOPIC_LENGTH}"
        )
    position = next(i for i, char in enumerate(topic) if not _TOPIC_CHARACTER.fullmatch(char))
    raise InvalidTopic(
        f"topic name {topic!r} has {topic[position]!r} at position {position}: only "
        "A-Z a-z 0-9 . _ - are allowed"
    )


def settings_text(settings: Mapping[str, SettingValue]) -> dict[str, str]:
    """Topic settings as the wire spells them: decimal text, a word, or "none" for a limit
    off."""
    return {key: "none" if value is None else str(value) for key, value in settings.items()}

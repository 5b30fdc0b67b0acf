"""The controller in the registry (docs/replication.md, "The controller"):

    /controller        ephemeral   the broker that is the controller, and its epoch
        {"version": 1, "broker_id": 2, "controller_epoch": 5}
    /controller_epoch  persistent  how many controllers were elected: the last one's epoch
        {"version": 1, "controller_epoch": 5}

A broker becomes the controller by creating /controller and raising /controller_epoch by one in
the same ZooKeeper transaction (both or neither), and stays so while its session lives: the
node is not re-created after a session expiry, as registrations are; the broker must be
elected again, with a new epoch. /controller_epoch is written by elections only, created
holding 1 and raised by one each time, so its node version is always its epoch minus one: a
controller's writes made conditional on that version (PartitionStates.write_partition_state with
`controller_epoch`) are refused once another controller was elected.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from kazoo.client import TransactionRequest

from broker.errors import PylogError, RegistryUnavailable
from broker.registry.nodes import decode, encode, int_field, validate_broker_id
from broker.registry.session import ATTEMPTS, BadVersion, NodeExists, NoNode, Session

log = logging.getLogger(__name__)

CONTROLLER = "/controller"
CONTROLLER_EPOCH = "/controller_epoch"


class ControllerMoved(PylogError):
    """A write made as controller of epoch `epoch` was refused: another controller was elected
    since (/controller_epoch is past that epoch). Nothing was written; this broker is no longer
    the controller and stops acting as one."""

    def __init__(self, epoch: int) -> None:
        super().__init__(
            f"controller epoch {epoch} is over: another controller was elected since; "
            "nothing was written"
        )
        self.epoch = epoch


@dataclass(frozen=True)
class ControllerInfo:
    """What /controller holds: the controller's broker id and its controller epoch."""

    broker_id: int
    epoch: int

    def to_json(self) -> bytes:
        return encode({"broker_id": self.broker_id, "controller_epoch": self.epoch})

    @classmethod
    def from_json(cls, data: bytes) -> ControllerInfo:
        """Parse node data; ValueError when it is not a controller's node."""
        obj = decode(data)
        broker_id, epoch = int_field(obj, "broker_id"), int_field(obj, "controller_epoch")
        validate_broker_id(broker_id)
        if epoch < 1:
            raise ValueError(f"'controller_epoch' must be >= 1, not {epoch}")
        return cls(broker_id, epoch)


def _epoch(data: bytes) -> int:
    epoch = int_field(decode(data), "controller_epoch")
    if epoch < 0:
        raise ValueError(f"'controller_epoch' must be >= 0, not {epoch}")
    return epoch


class Controller:
    """The controller's election in the registry (/controller, /controller_epoch), on
    `session`."""

    def __init__(self, session: Session) -> None:
        self._session = session
        self.path = session.chroot + CONTROLLER
        self.epoch_path = session.chroot + CONTROLLER_EPOCH

    def elect(self, broker_id: int) -> int | None:
        """Try to become the controller as `broker_id`: create the ephemeral /controller and
        raise /controller_epoch by one, in one transaction. Returns the new controller epoch
        (1 for the first controller of the cluster); the epoch this session holds already
        when it is the controller; None when another session holds /controller (watch it with
        `watch`, and try again when it goes).

        The node lives as long as this session; it is not re-created after an expiry (the
        controller then is whoever is elected next, perhaps this broker again with a new
        epoch). RegistryUnavailable when ZooKeeper cannot be reached or the nodes kept changing
        under ATTEMPTS tries; a request that timed out may have made this broker the
        controller: the next call says so (it returns the epoch held)."""
        validate_broker_id(broker_id)
        for _ in range(ATTEMPTS):
            try:
                data, stat = self._session.get(self.path)
            except NoNode:
                pass
            else:
                if stat.ephemeral_owner != self._session.session_id:
                    return None
                return self._parse_controller(data).epoch
            try:
                data, stat = self._session.get(self.epoch_path)
                epoch, version = self._parse_epoch(data), stat.version
            except NoNode:
                epoch, version = 0, -1
            elected = ControllerInfo(broker_id, epoch + 1)

            def build(
                transaction: TransactionRequest,
                version: int = version,
                elected: ControllerInfo = elected,
            ) -> None:
                transaction.create(self.path, elected.to_json(), ephemeral=True)
                node = encode({"controller_epoch": elected.epoch})
                if version < 0:
                    transaction.create(self.epoch_path, node)
                else:
                    transaction.set_data(self.epoch_path, node, version)

            try:
                self._session.commit(f"elect broker {broker_id} controller", build)
            except (NodeExists, BadVersion, NoNode):
                continue  # someone else was elected meanwhile: the next round sees who
            log.info("broker %d is the controller, epoch %d", broker_id, elected.epoch)
            return elected.epoch
        raise RegistryUnavailable(
            f"the controller's nodes changed under each of {ATTEMPTS} attempts to elect "
            f"broker {broker_id}: try again"
        )

    def _parse_controller(self, data: bytes) -> ControllerInfo:
        try:
            return ControllerInfo.from_json(data)
        except ValueError as error:
            raise RegistryUnavailable(f"{self.path} holds unreadable data: {error}") from None

    def _parse_epoch(self, data: bytes) -> int:
        try:
            return _epoch(data)
        except ValueError as error:
            raise RegistryUnavailable(f"{self.epoch_path} holds unreadable data: {error}") from None

    def current(self) -> ControllerInfo | None:
        """Who is the controller now, and its epoch; None when no broker is."""
        try:
            data, _ = self._session.get(self.path)
        except NoNode:
            return None
        return self._parse_controller(data)

    def epoch(self) -> int:
        """The epoch of the last controller elected (0 before the first election)."""
        try:
            data, _ = self._session.get(self.epoch_path)
        except NoNode:
            return 0
        return self._parse_epoch(data)

    def resign(self) -> bool:
        """Delete /controller if this session holds it (a broker that stops acting as the
        controller without ending its session); False when it did not hold it."""
        try:
            _, stat = self._session.get(self.path)
            if stat.ephemeral_owner != self._session.session_id:
                return False
            self._session.delete(self.path, stat.version)
        except (NoNode, BadVersion):
            return False
        log.info("resigned as the controller")
        return True

    def watch(self, callback: Callable[[ControllerInfo | None], bool]) -> None:
        """Call `callback(controller)` with who is the controller now and whenever /controller
        is created or deleted, and None while there is none, until the session stops or the
        callback returns False: a broker that is not the controller calls `elect` when it
        gets None. As TopicNodes.watch_topic_config: kazoo's DataWatch keeps it armed across
        reconnections and session expiries, this call does not wait on ZooKeeper, and the
        callback runs on kazoo's threads and must only hand the value on. A node whose data
        cannot be read is logged and passed over."""
        self._session.watch_data(
            self.path, ControllerInfo.from_json, lambda info, _: callback(info)
        )

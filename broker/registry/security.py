"""Principals and ACLs in the registry: one node each, so that every broker of a cluster sees
one consistent set and a change is one conditional write.

    /security/principals  persistent  {"version": 1, "principals": {"alice": ["<Z85 key>"]}}
    /security/acls        persistent  {"version": 1, "acls": [{"principal": "alice",
                                       "resource": "logs.*", "operations": ["fetch"]}]}

Brokers watch both (watch_principals, watch_acls) and apply a change within a second;
`pylogctl principal` and `pylogctl acl` write them (docs/security.md)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from broker.registry.nodes import decode, encode
from broker.registry.session import Session
from broker.security import Acl, check_key, check_principal_name, parse_operations

log = logging.getLogger(__name__)


Principals = dict[str, tuple[bytes, ...]]
"""name -> its public keys (Z85): a principal has one key, or two while it changes keys."""
T = TypeVar("T")


def _principals(data: bytes) -> Principals:
    if not data:
        return {}
    value = decode(data).get("principals")
    if not isinstance(value, dict):
        raise ValueError("'principals' is not an object")
    out: Principals = {}
    for name, keys in value.items():
        check_principal_name(name)
        if not isinstance(keys, list) or not all(isinstance(key, str) for key in keys):
            raise ValueError(f"the keys of principal {name!r} are not a list of strings")
        out[name] = tuple(check_key(key.encode(), f"key of principal {name!r}") for key in keys)
    return out


def _acls(data: bytes) -> list[Acl]:
    if not data:
        return []
    value = decode(data).get("acls")
    if not isinstance(value, list):
        raise ValueError("'acls' is not a list")
    out = []
    for entry in value:
        if not isinstance(entry, dict):
            raise ValueError("an ACL is not an object")
        principal, resource = entry.get("principal"), entry.get("resource")
        operations = entry.get("operations")
        if not isinstance(principal, str) or not isinstance(resource, str):
            raise ValueError("an ACL's 'principal' or 'resource' is not a string")
        if not isinstance(operations, list) or not all(isinstance(o, str) for o in operations):
            raise ValueError("an ACL's 'operations' is not a list of names")
        out.append(Acl(principal, resource, parse_operations(operations)))
    return out


def _acls_json(acls: list[Acl]) -> bytes:
    return encode(
        {
            "acls": [
                {
                    "principal": acl.principal,
                    "resource": acl.resource,
                    "operations": sorted(acl.operations),
                }
                for acl in acls
            ]
        }
    )


class Security:
    """The principals and ACLs in the registry, a node each (/security/principals,
    /security/acls), read and changed on `session`."""

    def __init__(self, session: Session) -> None:
        self._session = session
        self.principals_path = f"{session.chroot}/security/principals"
        self.acls_path = f"{session.chroot}/security/acls"

    def principals(self) -> Principals:
        """Every principal: name -> public key (Z85)."""
        return self._session.read_node(self.principals_path, _principals)[0]

    def acls(self) -> list[Acl]:
        """Every ACL, in the order they were added."""
        return self._session.read_node(self.acls_path, _acls)[0]

    def add_principal(self, name: str, key: bytes) -> bool:
        """Let the client with public key `key` (Z85) in as `name`: a new principal, or another
        key of one (to change a principal's key: add the new one, move its clients over, remove
        the old one). ValueError when the key is another principal's. Returns False when `name`
        had that key already."""
        check_principal_name(name)
        check_key(key, "public key")
        added = True

        def change(principals: Principals) -> Principals:
            nonlocal added
            for other, keys in principals.items():
                if other != name and key in keys:
                    raise ValueError(f"that key is already principal {other!r}'s")
            keys = principals.get(name, ())
            added = key not in keys
            return {**principals, name: (*keys, key) if added else keys}

        self._session.change(self.principals_path, _principals, change, _principals_json)
        return added

    def remove_principal(self, name: str, key: bytes | None = None) -> None:
        """Stop letting `name` in with `key`, or with any key (None). Its connections already
        open stay open until they close. KeyError when there is no such principal or key."""

        def change(principals: Principals) -> Principals:
            if name not in principals or (key is not None and key not in principals[name]):
                raise KeyError(name)
            keys = () if key is None else tuple(k for k in principals[name] if k != key)
            out = {k: v for k, v in principals.items() if k != name}
            return {**out, name: keys} if keys else out

        self._session.change(self.principals_path, _principals, change, _principals_json)

    def add_acl(self, acl: Acl) -> Acl:
        """Grant `acl`; merged into the ACL of the same principal and resource if there is
        one. Returns the ACL as stored."""
        merged = acl

        def change(acls: list[Acl]) -> list[Acl]:
            nonlocal merged
            out = []
            for old in acls:
                if (old.principal, old.resource) == (acl.principal, acl.resource):
                    merged = Acl(acl.principal, acl.resource, old.operations | acl.operations)
                    out.append(merged)
                else:
                    out.append(old)
            if merged is acl:
                out.append(acl)
            return out

        self._session.change(self.acls_path, _acls, change, _acls_json)
        return merged

    def remove_acl(self, acl: Acl) -> Acl | None:
        """Take `acl`'s operations away from its principal on its resource. Returns what is left
        of that ACL (None when nothing is); KeyError when no ACL of that principal and resource
        exists."""
        left: Acl | None = None

        def change(acls: list[Acl]) -> list[Acl]:
            nonlocal left
            out = []
            found = False
            for old in acls:
                if (old.principal, old.resource) != (acl.principal, acl.resource):
                    out.append(old)
                    continue
                found = True
                remaining = old.operations - acl.operations
                left = Acl(old.principal, old.resource, remaining) if remaining else None
                if left is not None:
                    out.append(left)
            if not found:
                raise KeyError(f"{acl.principal} on {acl.resource}")
            return out

        self._session.change(self.acls_path, _acls, change, _acls_json)
        return left

    def watch_principals(self, callback: Callable[[Principals], None]) -> None:
        """Call `callback(principals())` now and whenever they change, until the session stops."""
        self._session.watch_node(self.principals_path, _principals, callback)

    def watch_acls(self, callback: Callable[[list[Acl]], None]) -> None:
        """Call `callback(acls())` now and whenever they change, until the session stops."""
        self._session.watch_node(self.acls_path, _acls, callback)


def _principals_json(principals: Principals) -> bytes:
    return encode(
        {"principals": {name: [key.decode() for key in keys] for name, keys in principals.items()}}
    )

"""ZooKeeper ACLs on the registry's nodes (docs/registry.md, "Who may write what"): whether this
session may change a node, and giving the nodes of a registry made before its brokers had an
identity the brokers' ACL."""

from __future__ import annotations

import logging

from kazoo.security import ACL, Permissions, make_digest_acl_credential

from broker.errors import RegistryAccessDenied
from broker.registry.session import NoNode, Session

log = logging.getLogger("broker.registry.session")


class NodeAcls:
    """The registry's calls on the ACLs of its nodes, made on its session."""

    def __init__(self, session: Session) -> None:
        self._session = session

    def check_may_change(self, path: str) -> None:
        """Before a command writes `path` (a full path, chroot included): RegistryAccessDenied,
        as the write itself would raise it, when the ACLs say this session may not. The node's
        own ACL decides whether it may be changed (WRITE); absent, that of its nearest
        ancestor that exists whether it may be made (CREATE). Read from ZooKeeper, not tried:
        a command checks so before it prints what it will do. Another denial (NoNode, ...) is
        left to the write itself."""
        session = self._session
        needed, node = Permissions.WRITE, path
        while True:
            try:
                acls = session.get_acls(node)
                break
            except NoNode:
                needed, node = Permissions.CREATE, node.rsplit("/", 1)[0] or "/"
        mine = {("world", "anyone")}
        if session.auth is not None:
            auth = session.auth
            mine.add(("digest", make_digest_acl_credential(auth.user, auth.password)))
        if not any((acl.id.scheme, acl.id.id) in mine and acl.perms & needed for acl in acls):
            verb, may = ("change", "change") if node == path else ("create", "create nodes under")
            raise RegistryAccessDenied(
                f"{verb} {path}: refused by ZooKeeper's ACLs (NoAuth): they do not let "
                f"{session.identity} {may} {node}"
            )

    def secure_tree(self) -> int:
        """Give the brokers' nodes this session's ACL where they lack it (a registry made before
        its brokers had an identity): every node under the chroot, the session's shared paths
        the shared ACL and their subtrees left to their creators, a parent before its children
        are listed, and the chroot itself last. Returns how many nodes' ACLs were changed; 0 at
        once when the chroot has the ACL already (a run cut short did not reach it, so is done
        again whole). A broker calls it after start().

        RegistryAccessDenied when a node's ACL does not let this identity change it (a node
        made with another identity); RuntimeError for a session without `auth`."""
        session = self._session
        acl = session.acl
        if acl is None:
            raise RuntimeError("secure_tree needs a session with a ZooKeeper identity (auth)")
        if self._has_acl(session.chroot, acl):
            return 0
        children = session.children(session.chroot)
        changed = sum(self._secure(f"{session.chroot}/{child}", acl) for child in children)
        if self._set_acl(session.chroot, acl):
            changed += 1
        log.info("secured %d registry node(s) with the ACL of %s", changed, session.identity)
        return changed

    def _secure(self, path: str, acl: list[ACL]) -> int:
        """Give `path` and everything under it `acl` (a shared path the shared ACL, and not
        what is under it); how many nodes changed."""
        session = self._session
        if path[len(session.chroot) :] in session.shared_paths:
            return int(self._set_acl(path, session.shared_acl))
        changed = int(self._set_acl(path, acl))
        try:
            children = session.children(path)
        except NoNode:
            return changed
        return changed + sum(self._secure(f"{path}/{child}", acl) for child in children)

    def _has_acl(self, path: str, acl: list[ACL]) -> bool:
        return set(self._session.get_acls(path)) == set(acl)

    def _set_acl(self, path: str, acl: list[ACL]) -> bool:
        """Give `path` the ACL `acl`: False when it had it already or is gone."""
        try:
            if self._has_acl(path, acl):
                return False
            self._session.set_acls(path, acl)
        except NoNode:
            return False
        return True

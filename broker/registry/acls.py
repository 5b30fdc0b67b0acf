"""ZooKeeper ACLs on the registry's nodes (docs/registry.md, "Who may write what"): giving the
nodes of a registry made before its brokers had an identity the brokers' ACL."""

from __future__ import annotations

import logging

from kazoo.security import ACL

from broker.registry.session import NoNode, Session

log = logging.getLogger("broker.registry.session")


class ZooKeeperAcls(Session):
    """The registry's calls on the ACLs of its nodes."""

    def secure_tree(self) -> int:
        """Give the brokers' nodes this session's ACL where they lack it (a registry made before
        its brokers had an identity): every node under the chroot, the SHARED_PATHS the shared
        ACL and their subtrees left to their creators, a parent before its children are
        listed, and the chroot itself last. Returns how many nodes' ACLs were changed; 0 at
        once when the chroot has the ACL already (a run cut short did not reach it, so is done
        again whole). A broker calls it after start().

        RegistryAccessDenied when a node's ACL does not let this identity change it (a node
        made with another identity); RuntimeError for a session without `auth`."""
        acl = self._acl
        if acl is None:
            raise RuntimeError("secure_tree needs a session with a ZooKeeper identity (auth)")
        if self._has_acl(self.chroot, acl):
            return 0
        children = self.children(self.chroot)
        changed = sum(self._secure(f"{self.chroot}/{child}", acl) for child in children)
        if self._set_acl(self.chroot, acl):
            changed += 1
        log.info("secured %d registry node(s) with the ACL of %s", changed, self._identity)
        return changed

    def _secure(self, path: str, acl: list[ACL]) -> int:
        """Give `path` and everything under it `acl` (a SHARED_PATH the shared ACL, and not
        what is under it); how many nodes changed."""
        if path[len(self.chroot) :] in self.SHARED_PATHS:
            return int(self._set_acl(path, self._shared_acl))
        changed = int(self._set_acl(path, acl))
        try:
            children = self.children(path)
        except NoNode:
            return changed
        return changed + sum(self._secure(f"{path}/{child}", acl) for child in children)

    def _has_acl(self, path: str, acl: list[ACL]) -> bool:
        found, _ = self._request(
            f"read the ACL of {path}", lambda: self._client.get_acls_async(path)
        )
        return set(found) == set(acl)

    def _set_acl(self, path: str, acl: list[ACL]) -> bool:
        """Give `path` the ACL `acl`: False when it had it already or is gone."""
        try:
            if self._has_acl(path, acl):
                return False
            self._request(f"set the ACL of {path}", lambda: self._client.set_acls_async(path, acl))
        except NoNode:
            return False
        return True

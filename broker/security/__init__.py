"""Security: CurveZMQ key files and client credentials (broker.security.keys), the broker's ZAP
handler and principals (principals), and ACLs (acls); docs/security.md has the threat model and
the setup. Every name is importable from broker.security itself, as the README's examples do.

A client of a Curve broker needs its own key pair and the broker's public key (ClientKeys); a
client of a registry with ZooKeeper ACLs needs a ZooKeeper digest identity (ZooKeeperAuth).

The broker side, all of it on the front's loop (broker.front), which never waits here:

- ZapHandler answers ZeroMQ's authentication requests (ZAP, RFC 27) during each Curve
  handshake: a client key that names a principal (Principals: in ZooKeeper, or in the
  principals file) is let in with that principal as its ZeroMQ User-Id, any other is refused by
  ZeroMQ itself, before a request is read, and counted. A key of the cluster (BrokerKeys: the
  brokers' own key pair, and security.broker_keys) is the cluster principal, CLUSTER_PRINCIPAL:
  another broker, whose followers fetch as replicas.
- Authorizer decides whether a principal may do an operation on a topic, from the ACLs (kept in
  ZooKeeper, broker.registry.security).
"""

from broker.security.acls import (
    ALL,
    CACHED_DECISIONS,
    CLUSTER_OPERATIONS,
    Acl,
    Authorizer,
    Operation,
    check_resource,
    parse_operations,
)
from broker.security.keys import (
    PUBLIC_SUFFIX,
    SECRET_SUFFIX,
    Z85_KEY_LENGTH,
    BrokerKeys,
    ClientKeys,
    KeyFileError,
    ZooKeeperAuth,
    check_key,
    check_not_writable_by_others,
    check_private,
    generate_keys,
    load_key_pair,
    load_public_key,
)
from broker.security.principals import (
    CLUSTER_PRINCIPAL,
    PRINCIPALS_FILE_CHECK_S,
    ZAP_ENDPOINT,
    ZAP_VERSION,
    HandshakeFailures,
    Principals,
    ZapHandler,
    check_principal_name,
    read_principals_file,
)

__all__ = [
    "ALL",
    "CACHED_DECISIONS",
    "CLUSTER_OPERATIONS",
    "CLUSTER_PRINCIPAL",
    "PRINCIPALS_FILE_CHECK_S",
    "PUBLIC_SUFFIX",
    "SECRET_SUFFIX",
    "Z85_KEY_LENGTH",
    "ZAP_ENDPOINT",
    "ZAP_VERSION",
    "Acl",
    "Authorizer",
    "BrokerKeys",
    "ClientKeys",
    "HandshakeFailures",
    "KeyFileError",
    "Operation",
    "Principals",
    "ZapHandler",
    "ZooKeeperAuth",
    "check_key",
    "check_not_writable_by_others",
    "check_principal_name",
    "check_private",
    "check_resource",
    "generate_keys",
    "load_key_pair",
    "load_public_key",
    "parse_operations",
    "read_principals_file",
]

"""Replication (docs/replication.md): the leader's view of its followers (leader), a
follower's copy loop (follower), and the controller that chooses leaders (controller)."""

"""Consumer groups coordinated by the brokers (issue 49; docs/design/group-coordinator.md).

The rules, free of I/O: `choice` (which broker coordinates a group), `assignors` (a group's
target assignment), `group` (one group's members, epochs and reconciliation, fed requests and
the clock, returning replies and the registry writes that must land before them). `service`
runs them in a broker: claims, loads and writes through the registry, on the front's loop."""

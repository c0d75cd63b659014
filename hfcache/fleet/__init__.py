"""Fleet-scale commands built on the single-cache engines: ``hfcache sync`` (:mod:`.sync`), a node cache kept equal to
the union of the locks a cluster pins (docs/fleet.md)."""

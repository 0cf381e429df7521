"""Host processes: spawn, supervise, capture output within bounds, kill the whole tree."""

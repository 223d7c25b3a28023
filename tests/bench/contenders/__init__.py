"""Reference consumers and ceilings, each run by the bench as a process of its own."""

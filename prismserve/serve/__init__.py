"""Process wiring: the `prismserve` commands that start Ray, the runtime, the gateway and the control
loops (`serve`, `profile`), and the client commands. Above every other room; thin."""

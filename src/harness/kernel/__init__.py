"""The pure RunState kernel: states, the transition table and closing rules. No I/O."""

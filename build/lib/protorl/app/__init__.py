"""The application layer: the command-line entry points (`cli`), the commands as Python functions (`commands`), and
what a command checks and plans before it runs (the phases, the config's values, the memory and wall time it will
need) and writes after (a sweep's index)."""

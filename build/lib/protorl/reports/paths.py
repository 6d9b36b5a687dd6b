"""The result tools' rule on symlinks: protorl-analyze and protorl-aggregate read and write a path of a run
directory only if it stays inside that directory once every symlink on it is followed. A symlink within the run
is fine; one leading elsewhere (another run, another disk) would make the results describe files that are not
the run's, or write outside it."""

from __future__ import annotations

from pathlib import Path

from protorl.errors import ResultsError


def inside(path: Path, root: Path) -> Path:
    """`path`, once checked to stay inside `root` with every symlink on it followed; else ResultsError."""
    target = path.resolve()
    if not target.is_relative_to(root.resolve()):
        raise ResultsError(f"{path} leads through a symlink to {target}, outside {root}: "
                           "protorl reads and writes only inside the directories it is given")
    return path

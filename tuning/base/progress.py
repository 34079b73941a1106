"""Progress for long jobs: a tqdm bar per phase, a callable that takes lines, or nothing."""

from __future__ import annotations

from typing import Callable

from tuning.base.format import fit


class NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass

    def set_postfix_str(self, text: str) -> None:
        pass


def progress_bar(progress: bool | Callable[[str], None], total: int, desc: str):
    """(bar, line printer, status setter) for ``progress``."""
    if progress is True:
        from tqdm.auto import tqdm

        bar = tqdm(total=total, desc=desc, unit="step", leave=True, dynamic_ncols=True)
        return bar, lambda line: tqdm.write(fit(line)), lambda text: bar.set_postfix_str(text[:60])
    if callable(progress):
        return NoBar(), progress, lambda text: None
    return NoBar(), (lambda line: None), (lambda text: None)

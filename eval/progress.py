"""The sweep's progress bar."""

from __future__ import annotations


class Progress:
    """One bar for the whole sweep: model-images done, images/s, ETA, models finished."""

    def __init__(self, total: int, n_models: int, done: int, *, enabled: bool, rank: int) -> None:
        from tqdm.auto import tqdm

        self.n_models, self.done = n_models, done
        self.config = ""
        self.bar = tqdm(total=total, unit="img·model", disable=not enabled, dynamic_ncols=True,
                        desc=f"sweep[{rank}]" if rank else "sweep")
        self._post()

    def _post(self) -> None:
        self.bar.set_postfix_str(f"models done {self.done}/{self.n_models} {self.config}", refresh=False)

    def update(self, rows: int, n_models: int) -> None:
        self.bar.update(rows * n_models)
        self._post()

    def model_done(self) -> None:
        self.done += 1
        self._post()

    def close(self) -> None:
        self.bar.close()

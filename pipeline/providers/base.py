"""What reckon needs from a provider: submit under our own operation id, then ask by it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from pipeline.fleet import Server, attempt_cost
from pipeline.needs import Offer


@dataclass(frozen=True)
class OutputRef:
    """Where one produced output can be fetched; ``index`` is the job's output index."""

    index: int
    filename: str
    subfolder: str = ""
    folder_type: str = "output"
    content_type: str = "image/png"


@dataclass(frozen=True)
class OperationStatus:
    """What the provider says of one operation id.

    ``state``: ``pending`` (queued), ``running``, ``completed``, ``failed``, or
    ``interrupted`` (stopped at the provider), or ``unknown`` (the provider has no
    record of it). A failed operation may still list the outputs it produced before
    failing; ``retryable`` is False when the same graph would fail the same way.
    """

    state: str
    outputs: list[OutputRef] = field(default_factory=list)
    error: str | None = None
    retryable: bool = True
    #: A safe summary of the failure (node id, class type, error type, message), or None.
    detail: dict[str, str] | None = None
    #: Outputs the run made in all, ours or not (a graph runs whole: a retry for one missing
    #: output makes them all); None when the provider does not say. What the run is charged.
    produced: int | None = None
    #: Milliseconds the provider says it executed the prompt (its own start and end timestamps);
    #: None when it does not say (an older server, a prompt not ended). What a per-second price books.
    seconds_ms: int | None = None

    def cost(self, server: Server, max_seconds: int) -> tuple[int, int | None]:
        """What this ended run cost on ``server``, and the milliseconds booked (``fleet.attempt_cost``):
        a run is billed whole, every output it made, ours or not."""
        return attempt_cost(server, max(len(self.outputs), self.produced or 0), self.seconds_ms, max_seconds)


class Provider(Protocol):
    name: str
    price_per_output: int
    #: The websocket client id its prompts carry (a watcher connects as it), '' if none.
    client_id: str

    def submit(self, operation_id: str, workflow: dict[str, Any], indices: list[int], *,
               front: bool = False) -> dict[str, str] | None:
        """Start producing the outputs ``indices`` under ``operation_id`` (chosen by us), ahead of
        the provider's queue when ``front``. Returns a safe summary of the part of the input the
        provider refused while accepting the rest (it runs; the caller decides), else None."""

    def cancel(self, operation_id: str) -> None:
        """Stop the operation if the provider still can: drop it from its queue, interrupt it if it
        runs. Harmless for an operation that finished or is unknown."""

    def status(self, operation_id: str) -> OperationStatus:
        """Look the operation up by its id."""

    def fetch(self, ref: OutputRef) -> bytes:
        """The bytes of one produced output."""

    def epoch(self) -> str:
        """An id of the provider's current process life, '' if it shows none.

        The same epoch before submission and at reconciliation, with no record of
        the operation, proves the operation never executed; a new epoch proves
        nothing (the provider may have run it and forgotten).
        """

    def input_size(self, filename: str) -> int | None:
        """The size in bytes of the file ``filename`` in reckon's subfolder of the server's input folder
        (``pipeline.inputs.SUBFOLDER``), None if it has none: a cheap check, no body."""

    def upload_input(self, filename: str, data: bytes, *, overwrite: bool = False) -> None:
        """Put ``data`` at ``filename`` in reckon's subfolder of the server's input folder (``overwrite``:
        replace a file of that name whatever it holds)."""

    def offers(self) -> Offer | None:
        """What the server can run (node classes, model files per folder: pipeline/needs.py), or None
        when it does not say (then it is taken to run anything)."""

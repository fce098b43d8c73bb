"""The RTO split into stages: a proportional bar and seconds and shares, filling in as stages finish; under the RTO,
a finished restore whose digests were not checked says so; then the floor's line (tui.widgets.floorline)."""

from __future__ import annotations

from rich.text import Text
from textual.widget import Widget

from ckptbench.core.errors import printable
from ckptbench.core.stages import STAGES, VERIFY
from ckptbench.core.units import human_pct
from ckptbench.restore.efficiency import hash_of, no_reference
from ckptbench.system import readmode

COLORS = dict(zip(STAGES, ("magenta", "green", "cyan", "blue", "yellow", "red")))


class StageBar(Widget):
    DEFAULT_CSS = """
    StageBar { height: 4; }
    """

    def __init__(self, total_word: str = "RTO", **kw):
        """`total_word` names the stages' total: a restore's RTO, or on a distributed run's rank lane that rank's
        own time (the run's RTO ends with its slowest rank, so each lane saying "RTO" gave four RTOs for one run)."""
        super().__init__(**kw)
        self.total_word = total_word
        self.stages: dict[str, float] = {}
        self.active: str | None = None
        self.note = ""
        self.shown: tuple[str, ...] = STAGES
        self.floor = Text()
        self.failed = False
        self.unverified = ""  # why the last restore's digests were not checked against a reference; "" when they were
        self.rto: float | None = None  # a finished run's median RTO, as run and history give it; None: the stages' sum

    def update_stages(self, stages: dict[str, float], active: str | None, note: str | None = None,
                      shown: tuple[str, ...] = STAGES, failed: bool | None = None,
                      unverified: str | None = None, rto: float | None = None) -> None:
        """`note` follows the RTO (e.g. the one-time warm-up that was kept out of it); None keeps the current one.
        `shown`: the stages this kind of run has (a loop pass: list and read), in STAGES order. `failed`: the run
        stopped with an error: its stages so far are shown, and no RTO (there was no restore to time); None keeps
        the current state (the screen's poll redraws the stages after the run ended). `unverified`: the line under
        the RTO of a restore that finished with nothing checked (verify_line), "" none; None keeps the current one.
        `rto`: a finished run's median RTO (its document's rto_s), shown and the shares taken over it as `run` does:
        the sum of the stages' medians is not it (0.080 s on the screen, 0.081 s in history for one run)."""
        failed = self.failed if failed is None else failed
        unverified = self.unverified if unverified is None else unverified
        # a run that stopped early (failed verify) has no figure for the stages it never reached
        stages = {k: v for k, v in stages.items() if v is not None}
        note = self.note if note is None else note
        shown = tuple(s for s in STAGES if s in shown)
        now = (stages, active, note, shown, failed, unverified, rto)
        if now != (self.stages, self.active, self.note, self.shown, self.failed, self.unverified, self.rto):
            self.stages, self.active, self.note, self.shown, self.failed, self.unverified, self.rto = now
            self.refresh(layout=True)  # only on a change: a redraw costs CPU; the unverified line is one more row

    def show_floor(self, line: Text) -> None:
        if line != self.floor:  # a redraw costs CPU
            self.floor = line
            self.refresh()

    def render(self) -> Text:
        width = max(20, self.size.width - 2)
        total = sum(self.stages.values())
        out = Text()
        if total > 0:
            used = 0
            for s in self.shown:
                v = self.stages.get(s)
                if v is None:
                    continue
                n = max(1, round(v / total * width)) if v > 0 else 0
                n = min(n, width - used)
                out.append("█" * n, style=COLORS[s])
                used += n
        out.append("\n")
        for s in self.shown:
            v = self.stages.get(s)
            mark = "▶" if s == self.active and v is None else " "
            if v is None:
                out.append(f"{mark}{s} …  ", style="bold" if mark == "▶" else "dim")
            else:
                over = self.rto or total
                share = v / over if over else 0
                out.append(f" {s} ", style=f"bold {COLORS[s]}")
                out.append(f"{v:.3f}s {human_pct(share)}  ")
        if self.failed:
            out.append(f"\n {self.total_word} — ", style="bold")
            out.append(f"(failed after {total:.3f}s: no restore to time)", style="red")
        else:
            rto = self.rto if self.rto is not None else total
            out.append(f"\n {self.total_word} {rto:.3f}s" if rto else f"\n {self.total_word} —")
        if self.note:
            out.append(f"   ({self.note})", style="dim")
        if self.unverified:  # beside the RTO it qualifies, not in a toast that vanishes
            out.append(f"\n {self.unverified}", style="bold yellow")
        return out.append("\n").append_text(self.floor)


def verify_line(doc: dict) -> str:
    """What a finished restore that checked no digest against a reference says under its RTO, in `run`'s words
    ("NOT VERIFIED") and with the verify stage's note saying why; "" for one that was verified or did not finish."""
    if doc.get("verified") or doc.get("status") not in ("ok", "unverified"):
        return ""
    note = printable((doc.get("notes") or {}).get(VERIFY) or "")
    return note if note.startswith("NOT VERIFIED") else "digests: NOT VERIFIED (no reference to compare with)"


def digest_words(asked: str | None, listing) -> str:
    """What the verify stage will do, for the settings line: the digest a restore computes (the domain's hash_of) and
    what it is checked against. `asked` is --hash (None: the manifest's); `listing` the source's, None until it is
    listed (then the option is all there is to say). Where nothing can be checked it says so, as `run` does."""
    if listing is None:
        return asked or "manifest"
    alg = hash_of(asked, listing)
    why = no_reference(alg, listing.manifest)  # as the restore's NOT VERIFIED note decides it
    return f"{alg} (NOT VERIFIED: {why})" if why else f"{alg} (the manifest's)"


def run_note(doc: dict) -> str:
    """What follows a finished run's RTO: the read path and why, a warm-up kept out of the clock, a structural check."""
    notes = [f"read {', '.join(doc['read']['modes'])}: {readmode.short(doc['read']['why'])}"]
    if doc.get("warmup_s"):
        notes.append(f"one-time warm-up {doc['warmup_s']:.2f} s before the clock, not counted")
    if doc.get("check") == "structural":
        notes.append("check: structural, no model step")
    return "; ".join(notes)

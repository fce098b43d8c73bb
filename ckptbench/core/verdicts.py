"""A judgement, wherever one is made: what was judged, the verdict, the evidence that decides it, why, and the fix.

The checklist's items and a watch's bottleneck class are both this one type."""

from __future__ import annotations

from dataclasses import dataclass, field, fields


@dataclass(frozen=True)
class Verdict:
    id: str  # what was judged: a checklist item ("concurrency"), a watched restore ("bottleneck")
    title: str
    verdict: str  # the checklist's ok | warn | fail | unknown; a watch's bottleneck class ("storage-bound")
    evidence: dict
    why: str  # why it matters (a rule), or what this case shows (a watch: the job's rate against the storage's)
    fix: str
    # extra keys its document keeps for readers written before this type: {key in the document: field it copies}
    aliases: dict = field(default_factory=dict, compare=False, repr=False)

    def to_json(self) -> dict:
        doc = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "aliases"}
        return doc | {key: doc[name] for key, name in self.aliases.items()}

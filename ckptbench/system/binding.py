"""What binds a floor, said one way wherever a floor is shown: the resource, the rate the floor holds it to and
what that rate is a rate of. One device has several rates, each right for its destination: read into fresh memory
(a restore's), into reused buffers (a read's, a sweep's); a new user met "bound by storage" at 5.10, 1.84 and 2.41
GB/s in `floor`, `run` and `sweep` and could not tell which was the box's."""

from __future__ import annotations

FRESH, REUSED = "fresh", "reused"  # a restore's destination: memory it did not own before, or buffers it reuses


def how(binding: str, *, destination: str, hot: bool, read_fresh: bool = False, own_page_cache: bool = False,
        reused_copy: bool = False, cores: int = 1, cpu_work: str = "", one_file: bool = False) -> str:
    """What the binding resource's rate is a rate of, in a few words (the model's own terms: floor.model).
    `read_fresh`: the storage figure was read into fresh memory; `own_page_cache`: the page cache's copy is the
    mount's own (else a memmove's); `reused_copy`: copied into a reused buffer; `cpu_work`: what the cores do
    ("hashing (md5)", "scanning", both); `one_file`: the largest file's digest, in order on one core, binds."""
    if binding in ("storage", "network"):
        return "read into fresh memory" if destination == FRESH and read_fresh else "read into reused buffers"
    if binding == "page cache":
        if not own_page_cache:
            return "a memmove's, standing in for the page cache's copy"
        return "copied into a reused buffer" if reused_copy else "copied into populated memory"
    if binding == "fresh memory":
        return "populated"
    if binding == "cpu":
        if one_file:
            return f"{cpu_work or 'the CPU work'}, the largest file's bytes in order on one core"
        return f"{cpu_work or 'the CPU work'} on {cores} core{'s' if cores != 1 else ''}"
    if binding == "host-to-device":
        return "copied from pinned memory"
    if binding == "storage write":
        return "written and fsync'd"
    if binding == "copy":
        return "a memmove into populated memory"
    return ""


def phrase(binding: str | None, gbps: float | None, what: str | None) -> str:
    """"storage (1.84 GB/s read into fresh memory)": the binding resource, its rate and what the rate is of; "" with
    no binding."""
    if not binding:
        return ""
    inside = " ".join(p for p in (f"{gbps:.2f} GB/s" if gbps else "", what or "") if p)
    return f"{binding} ({inside})" if inside else str(binding)


def parts(floor_s: float | None, times: dict | None) -> str:
    """Each resource's time, as they make the floor: "fresh memory 0.148 s + page cache 0.103 s" where they add up
    (from the page cache, every part is the cores'), else "storage 0.546 s, fresh memory 0.210 s" (the largest
    binds); "" for one part. A hot floor named with one part's rate read as a floor that rate does not give."""
    times = times or {}
    if len(times) < 2 or not floor_s:
        return ""
    adds = abs(sum(times.values()) - floor_s) <= 1e-6 * max(floor_s, 1e-9) + 1e-9
    ordered = sorted(times.items(), key=lambda kv: -kv[1])
    return (" + " if adds else ", ").join(f"{k} {v:.3f} s" for k, v in ordered)


def text(fields: dict) -> str:
    """The phrase of a document's floor fields (binding, binding_gbps, binding_how)."""
    return phrase(fields.get("binding"), fields.get("binding_gbps"), fields.get("binding_how"))


def bound(fields: dict) -> str:
    """What follows "bound by" in a floor line: the phrase, then the parts that make the floor where there are
    several."""
    made_of = parts(fields.get("floor_s"), fields.get("floor_times_s"))
    return text(fields) + (f"; {made_of}" if made_of else "")


def of_model(m: dict) -> str:
    """The phrase of floor.model's answer (binding, gbps, how)."""
    return phrase(m.get("binding"), m.get("gbps"), m.get("how"))

"""Every option declared once in core/options: the parser is rendered from the declarations, the flags, choices and
defaults are still today's, and no other module spells a vocabulary of its own."""

from __future__ import annotations

import argparse
import ast
import os

import fastio
import pytest

from ckptbench.checkpoint import profiles
from ckptbench.cli import root
from ckptbench.core import options as o
from ckptbench.restore import repeat
from ckptbench.system import pagecache

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# every command's arguments as they were before the declarations: flags{choices}=default, in --help order
TODAY = {
    "read": "targets --concurrency/-c=8 --read{auto,pread,mmap,direct}=auto --hash{none,crc32c,xxh64,md5,sha256}=crc32c "
            "--block-size=1048576 --chunk-size --part-size=8388608 --multipart --cache{cold,hot,as-is}=as-is "
            "--drop-caches --s3-client{threads,crt}=threads --pick --json",
    "run": "source --mode{staged,fused}=fused --cache{cold,hot,as-is}=as-is --drop-caches --concurrency/-c=8 "
           "--read{auto,pread,mmap,direct}=auto --hash{none,crc32c,xxh64,md5,sha256} --block-size=1048576 "
           "--device=cpu --repeat=3 --optimizer-step --part-size=8388608 --stage-dir --s3-client{threads,crt}=threads "
           "--results=results.csv --price-per-hour --spot-discount=0.0 --restores-per-day=1.0 --json --distributed "
           "--each-rank{part,all}=part --rank-timeout=300.0 --tensor-digests --pick",
    "watch": "target --match --interval=0.25 --no-verdict --results=results.csv --source --pick --json --tui",
    "inspect": "source --concurrency/-c=8 --json --tensors --pick",
    "sweep": "source --levels=1,8,16,32,64 --s3-client{threads,crt}=threads --repeat=3 --cache{cold,hot,as-is}=cold "
             "--read{auto,pread,mmap,direct}=auto --hash{none,crc32c,xxh64,md5,sha256}=none --block-size=1048576 "
             "--part-size=8388608 --json --distributed --each-rank{part,all}=part --rank-timeout=300.0 --pick "
             "--results=",
    "compare": "results=results.csv --newest --kind --baseline --threshold=5.0 --json",
    "history": "results=results.csv --json",
    "check": "source --concurrency/-c=8 --quick-sweep --results=results.csv --pick --json --markdown",
    "plan": "profile --interval --scale=1.0 --nodes --ranks-per-node --storage --node-memory --results=results.csv --target --json",
    "save": "what target --format{safetensors,torch,dcp}=safetensors --scale=1.0 --interval --count=3 --keep=2 "
            "--ranks=1 --stagger=0.0 --async --fsync/--no-fsync=True --force --results=results.csv --json --pick",
    "gen": "profile directory --format{safetensors,torch,dcp} --ranks --seed=0 --scale=1.0 "
           "--digest{crc32c,md5}=crc32c --force",
    "verify": "directory --concurrency/-c=8 --json --pick",
    "load": "directory --no-verify --optimizer-step --json --pick",
    "pack": "directory out --target-files=4",
    "unpack": "directory out",
    "upload": "directory url --concurrency/-c=8 --part-size=8388608",
    "tui": "source --results=results.csv --pick --run --loop --watch --ranks",
    "demo": "--dir --headless --scale=1.0 --s3",
    "sysinfo": "source --json --pick",
    "floor": "source --remeasure --json --pick --s3-client{threads,crt}=threads --write-to",
}
# each group of flags that exclude each other, per command
EXCLUSIVE = {"watch": [["json", "tui"]], "check": [["json", "markdown"]], "tui": [["run", "loop", "watch", "ranks"]],
             "compare": [["newest", "kind"]]}


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = root.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _actions(p: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in p._actions if not isinstance(a, argparse._HelpAction)]


def _spell(a: argparse.Action) -> str:
    s = "/".join(a.option_strings) or a.dest
    if a.choices:
        s += "{" + ",".join(map(str, a.choices)) + "}"
    if a.default is not None and not (isinstance(a, argparse._StoreTrueAction) and a.default is False):
        s += f"={a.default}"
    return s


def _flat(args: tuple) -> list[o.Option]:
    return [opt for arg in args for opt in (arg if isinstance(arg, tuple) else (arg,))]


DECLARED = [v for v in vars(o).values() if isinstance(v, o.Option)]


def test_the_flags_choices_and_defaults_are_todays():
    subs = _subparsers()
    assert list(subs) == list(TODAY)
    for name, p in subs.items():
        assert " ".join(_spell(a) for a in _actions(p)) == TODAY[name], name
        groups = [[a.dest for a in g._group_actions] for g in p._mutually_exclusive_groups]
        assert groups == EXCLUSIVE.get(name, []), name


@pytest.mark.parametrize("cmd", root.COMMANDS, ids=lambda c: c.name)
def test_every_argument_is_rendered_from_its_declaration(cmd):
    actions = _actions(_subparsers()[cmd.name])
    opts = _flat(cmd.args)
    assert len(actions) == len(opts)
    for a, opt in zip(actions, opts):
        negated = tuple(f"--no-{f[2:]}" for f in opt.flags) if opt.action == "negatable" else ()
        assert (tuple(a.option_strings), a.dest, a.metavar) == (opt.flags + negated, opt.dest, opt.metavar)
        assert opt.action or a.nargs == opt.nargs  # a switch takes no value (argparse says nargs 0)
        assert a.choices == opt.choices and a.default == (False if opt.action == "store_true" else opt.default)
        assert a.help == root._with_default(opt) and (a.type is None) == (opt.parse is None)
        if opt.const is not None:
            assert a.const == opt.const


@pytest.mark.parametrize("cmd", root.COMMANDS, ids=lambda c: c.name)
def test_a_command_only_rewords_a_declaration(cmd):
    """An override may change a default, the help or a metavar; what the flag is and takes stays the declaration's."""
    for opt in _flat(cmd.args):
        same = [d for d in DECLARED if (d.flags, d.dest, d.parse, d.choices, d.action) ==
                (opt.flags, opt.dest, opt.parse, opt.choices, opt.action)]
        assert same, f"{cmd.name}: {opt.flags or opt.dest} is declared nowhere in core/options"


def test_one_concurrency_declaration_serves_every_command():
    takers = {c.name for c in root.COMMANDS for opt in _flat(c.args) if opt.dest == "concurrency"}
    assert takers == {"read", "run", "inspect", "check", "verify", "upload"}
    for c in root.COMMANDS:
        for opt in _flat(c.args):
            if opt.dest == "concurrency":
                assert opt.parse is o.CONCURRENCY.parse and opt.default == o.CONCURRENCY.default


def test_a_bad_value_is_the_declarations_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        root.build_parser().parse_args(["read", "x", "--concurrency", "0"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"must be {o.conc.MIN}..{o.conc.MAX}, got 0" in err
    args = root.build_parser().parse_args(["read", "x", "-c", "4", "--block-size", "4K"])
    assert (args.concurrency, args.block_size) == (4, 4096)


def test_the_vocabularies_are_the_lower_layers_and_the_domains_one_spelling():
    assert o.HASHES is fastio.HASHES and o.READ_MODES == (o.AUTO, *fastio.READ_MODES)
    assert pagecache.CACHE_MODES is o.CACHE_MODES and profiles.FORMATS is o.FORMATS
    assert repeat.MODES is o.RESTORE_MODES


def test_a_control_cycles_from_the_default_to_the_off_choice():
    assert o.MODE.values == ("fused", "staged")
    assert o.CACHE.values == ("as-is", "cold", "hot")
    assert o.READ.values == ("auto", "pread", "mmap", "direct")
    assert o.RESTORE_HASH.values == (None, "crc32c", "xxh64", "md5", "sha256", "none")


def _literal_vocabularies(path: str) -> list[tuple[int, tuple]]:
    """Tuples and lists of two or more plain strings spelling (a rearrangement of) one of the vocabularies."""
    vocab = [set(v) for v in (o.HASHES, o.READ_MODES, fastio.READ_MODES, o.CACHE_MODES, o.RESTORE_MODES, o.FORMATS,
                              o.S3_CLIENTS, o.EACH_RANK)]
    found = []
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, (ast.Tuple, ast.List)) and len(node.elts) >= 2:
            words = [e.value for e in node.elts if isinstance(e, ast.Constant)]
            strs = {w for w in words if isinstance(w, str)}
            if len(words) == len(node.elts) and any(strs == v for v in vocab):
                found.append((node.lineno, tuple(words)))
    return found


# spellings left to take from core/options (files outside this change); drop a line once its file does
NOT_YET: set[str] = set()


def test_no_module_spells_a_vocabulary_of_its_own():
    own = {os.path.join(REPO, "ckptbench", "core", "options.py")}
    spelled = []
    for top in ("ckptbench", "tui"):
        for dirpath, _, names in os.walk(os.path.join(REPO, top)):
            for n in names:
                path = os.path.join(dirpath, n)
                if n.endswith(".py") and path not in own:
                    spelled += [(f"{os.path.relpath(path, REPO)} {words}", line) for line, words in
                                _literal_vocabularies(path)]
    new = [f"{what} (line {line})" for what, line in spelled if what not in NOT_YET]
    assert not new, "take these from ckptbench.core.options: " + "; ".join(new)
    assert NOT_YET <= {what for what, _ in spelled}, "one of NOT_YET takes it from core/options now: drop its line"


def test_every_option_with_a_value_says_its_default_in_its_help():
    """A new user could not tell --concurrency's or --repeat's default without running the command; nor say a
    default twice ("(1M) (default: 1M)")."""
    for name, p in _subparsers().items():
        for a in _actions(p):
            if not a.option_strings or a.nargs == 0 or a.default in (None, "", False) or not a.help:
                continue
            if isinstance(a, argparse.BooleanOptionalAction):
                continue  # argparse says its default itself
            assert "default" in a.help, (name, a.option_strings, a.help)
            assert a.help.count("default") == 1 or "(default: " not in a.help, (name, a.help)
    help_text = _subparsers()["run"].format_help()
    assert "bytes per read call (default: 1M)" in " ".join(help_text.split())
    assert "before the run fails naming it (default: 300)" in " ".join(help_text.split())

"""What a shell command would delete, as the shell would read it (SPEC G1, the `shell_wipes` guardrail).

Defence in depth: the sandbox is the wall that keeps a command inside its Run's working directory; this
check refuses, before anything runs, a command that plainly sets out to delete a protected directory
(by default `/`) or everything in it. A regex over the raw text misses `rm -rf "/"`, `rm -rf /.`,
`rm -rf //`, `/bin/rm -rf /`, `find / -delete` or `cd / && rm -rf *`; so the command is parsed:

1. split like the shell (shlex, POSIX quoting) into simple commands at `;`, `&&`, `||`, `|`, `&`,
   newlines and parentheses, recursing into `sh -c '…'`, `bash -c`, `eval`, and past wrappers such
   as `sudo`, `env`, `nice`, `xargs`, `command`, `exec` or `\\rm`, whatever directory the binary is in;
2. follow `cd`/`pushd` and `NAME=value` assignments through the compound command;
3. normalise each deletion target: quotes stripped, `$NAME`/`${NAME}` replaced by what was assigned
   (or nothing, as an unset variable expands), relative paths joined to the directory `cd` reached,
   `//` collapsed, `.` and `..` resolved (posixpath.normpath);
4. refuse when a recursive `rm`, or a `find` with `-delete` or `-exec rm`, targets a protected directory,
   one of its ancestors, or a glob of its entries (`/*`, `/.*`); and, since then what is deleted cannot
   be told, when its target climbs out of the working directory (`../…`), is relative after a `cd` to a
   place that cannot be known, is built by command substitution, or comes from `xargs`; and a command
   that cannot be parsed at all (fail closed).

Deletions inside the working directory or of other absolute paths, and non-recursive removals, pass.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

SEPARATORS = frozenset({";", "&&", "||", "|", "&", "|&", "(", ")", ";;", "\n"})
REDIRECTIONS = frozenset({">", ">>", "<", "<<", "<<<", ">&", "<&", "&>", "&>>", ">|", "<>"})
#: commands that run the command after them (their own options skipped)
WRAPPERS = frozenset({"sudo", "doas", "env", "nice", "nohup", "time", "command", "exec", "builtin", "xargs",
                      "stdbuf", "ionice", "chroot", "timeout", "busybox", "caffeinate", "unbuffer"})
SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "ash", "fish"})
#: the commands this module looks into
CHECKED = frozenset({"rm", "find", "eval", "cd", "pushd", "export"}) | SHELLS | WRAPPERS
_VARIABLE = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)[^}]*\}|([A-Za-z_][A-Za-z0-9_]*))")
_ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.DOTALL)
_GLOB = re.compile(r"[*?\[{]")
#: what a command substitution is replaced with: its output cannot be known here
SUBSTITUTED = "__command_substitution__"
#: how deep `sh -c` / `eval` nesting is followed
MAX_DEPTH = 4


@dataclass
class _Shell:
    """What the command has done so far: where `cd` went (None: unknown; "" the working directory)."""

    cwd: str | None = ""
    env: dict[str, str] = field(default_factory=dict)


def wipes(command: str, protected: Sequence[str] = ("/",)) -> str | None:
    """Why `command` would delete a protected directory (or everything in it); None when it would not."""
    roots = [_collapse(p) for p in protected]
    try:
        return _script(command, roots, _Shell(), 0)
    except ValueError as exc:  # unbalanced quotes and the like: not known to be safe
        return f"the command cannot be parsed ({exc}); refused rather than guessed"


def _script(text: str, roots: list[str], shell: _Shell, depth: int) -> str | None:
    if depth > MAX_DEPTH:
        return "commands nested too deep to check"
    text, inner = _substitutions(text)
    for script in inner:  # `$(…)` and backticks run too, before the command they are part of
        found = _script(script, roots, shell, depth + 1)
        if found:
            return found
    for words in _commands(text):
        found = _command(words, roots, shell, depth)
        if found:
            return found
    return None


def _substitutions(text: str) -> tuple[str, list[str]]:
    """`text` with each command substitution (`$(…)`, `` `…` ``) replaced by SUBSTITUTED, and their
    scripts. Quoting is not considered: a quoted `$(` is checked as if it ran (fail closed)."""
    out: list[str] = []
    inner: list[str] = []
    i = 0
    while i < len(text):
        if text.startswith("$(", i):
            depth, j = 1, i + 2
            while j < len(text) and depth:
                depth += {"(": 1, ")": -1}.get(text[j], 0)
                j += 1
            if depth:
                raise ValueError("unbalanced $(")
            inner.append(text[i + 2:j - 1])
            out.append(SUBSTITUTED)
            i = j
        elif text[i] == "`":
            j = text.find("`", i + 1)
            if j < 0:
                raise ValueError("unbalanced backtick")
            inner.append(text[i + 1:j])
            out.append(SUBSTITUTED)
            i = j + 1
        else:
            out.append(text[i])
            i += 1
    return "".join(out), inner


def _commands(text: str) -> Iterator[list[str]]:
    """Simple commands (lists of words), split at the shell's control operators."""
    lexer = shlex.shlex(text.replace("\n", " ; "), posix=True, punctuation_chars=";&|()<>")
    lexer.whitespace_split = True
    lexer.commenters = ""
    words: list[str] = []
    for token in lexer:
        if token in SEPARATORS:
            if words:
                yield words
            words = []
        else:
            words.append(token)
    if words:
        yield words


def _command(words: list[str], roots: list[str], shell: _Shell, depth: int) -> str | None:
    words = _without_redirections(words)
    while words and _ASSIGNMENT.match(words[0]):  # NAME=value (a command's own prefix, or alone)
        name, value = _ASSIGNMENT.match(words[0]).groups()  # type: ignore[union-attr]
        shell.env[name] = _expand(value, shell)
        words = words[1:]
    words, through_xargs = _unwrap(words)
    if not words:
        return None
    name, args = _name(words[0]), words[1:]
    if name in ("cd", "pushd", "chdir"):
        _change_directory(args, shell)
    elif name == "export":
        for arg in args:
            match = _ASSIGNMENT.match(arg)
            if match:
                shell.env[match.group(1)] = _expand(match.group(2), shell)
    elif name in SHELLS:
        script = [i for i, a in enumerate(args[:-1]) if a.startswith("-") and not a.startswith("--") and "c" in a]
        return _script(args[script[0] + 1], roots, shell, depth + 1) if script else None
    elif name == "eval":
        return _script(" ".join(args), roots, shell, depth + 1)
    elif name == "rm":
        return _rm(args, roots, shell, through_xargs)
    elif name == "find":
        return _find(args, roots, shell)
    return None


def _without_redirections(words: list[str]) -> list[str]:
    kept: list[str] = []
    skip = False
    for word in words:
        if skip:
            skip = False
        elif word in REDIRECTIONS:
            skip = True  # the file the redirection names is not an argument
        else:
            kept.append(word)
    return kept


def _unwrap(words: list[str]) -> tuple[list[str], bool]:
    """The command a wrapper runs (`sudo -u x rm …` → `rm …`), and whether it came through xargs (its
    arguments then come from its input)."""
    through_xargs = False
    while words and _name(words[0]) in WRAPPERS:
        through_xargs = through_xargs or _name(words[0]) == "xargs"
        # the wrapped command is the first word that is one we check (option values are skipped over)
        rest = [i for i, w in enumerate(words[1:], 1) if _name(w) in CHECKED]
        words = words[rest[0]:] if rest else []
    return words, through_xargs


def _name(word: str) -> str:
    return posixpath.basename(word.lstrip("\\"))


def _change_directory(args: list[str], shell: _Shell) -> None:
    targets = [a for a in args if not a.startswith("-")]
    unknown = targets and (SUBSTITUTED in targets[0] or any(
        (m.group(1) or m.group(2)) not in shell.env for m in _VARIABLE.finditer(targets[0])))
    if not targets or targets[0] in ("~", "-") or unknown:
        shell.cwd = None  # home, the previous directory, a computed one: not known here
        return
    shell.cwd = _absolute(_expand(targets[0], shell), shell)


def _expand(word: str, shell: _Shell) -> str:
    """`word` with $NAME / ${NAME} replaced by what the command assigned, or by nothing (unset)."""
    return _VARIABLE.sub(lambda m: shell.env.get(m.group(1) or m.group(2), ""), word)


def _collapse(path: str) -> str:
    normal = posixpath.normpath(re.sub(r"/+", "/", path)) if path else path
    return "/" if normal.startswith("//") else normal


def _absolute(path: str, shell: _Shell) -> str | None:
    """The normalised absolute path, or a normalised relative one when the working directory is where
    it starts; None when it is relative to a directory that cannot be known."""
    if path.startswith("/"):
        return _collapse(path)
    if shell.cwd is None:
        return None
    return _collapse(posixpath.join(shell.cwd, path)) if shell.cwd else _collapse(path)


def _rm(args: list[str], roots: list[str], shell: _Shell, through_xargs: bool = False) -> str | None:
    recursive, targets, options = False, [], True
    for arg in args:
        if options and arg == "--":
            options = False
        elif options and arg.startswith("--"):
            recursive = recursive or arg in ("--recursive", "--dir") or arg == "--no-preserve-root"
        elif options and arg.startswith("-") and arg != "-":
            recursive = recursive or "r" in arg or "R" in arg
        else:
            targets.append(arg)
    if not recursive:
        return None
    if through_xargs:
        return "xargs rm -r: what it deletes comes from its input and cannot be checked"
    return _targets("rm -r", targets, roots, shell)


def _find(args: list[str], roots: list[str], shell: _Shell) -> str | None:
    deletes = "-delete" in args or any(
        a in ("-exec", "-execdir", "-ok", "-okdir") and i + 1 < len(args)
        and posixpath.basename(args[i + 1]) in ("rm", "shred", "unlink")
        for i, a in enumerate(args))
    if not deletes:
        return None
    starts = []
    for arg in args:
        if arg.startswith(("-", "(", "!")):
            break
        starts.append(arg)
    return _targets("find … -delete", starts or ["."], roots, shell)


def _targets(what: str, targets: list[str], roots: list[str], shell: _Shell) -> str | None:
    for raw in targets:
        if SUBSTITUTED in raw:
            return f"{what} of {raw!r}: a target built by command substitution cannot be checked"
        path = _absolute(_expand(raw, shell), shell)
        if path is None:
            return f"{what} of {raw!r} after a cd to a directory that cannot be known"
        if path == ".." or path.startswith("../"):
            return f"{what} of {raw!r} reaches out of the working directory"
        if not path.startswith("/"):
            continue  # inside the working directory
        for root in roots:
            if _covers(path, root):
                return f"{what} of {raw!r} deletes {root}" + (f" (as {path})" if path != raw else "")
    return None


def _covers(path: str, root: str) -> bool:
    """Whether deleting `path` deletes `root` or every entry of it."""
    if path == root or root.startswith(path.rstrip("/") + "/") or path == "/":
        return True
    parent, last = posixpath.split(path)
    return parent == root and bool(_GLOB.search(last))

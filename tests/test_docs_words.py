"""The prose of README.md and docs/*.md: no words about how the work was organised, no broken links.

- Words: the docs describe the code, the runs and the machines, dated; they do not narrate the
  work's own history. "session" (any case, also "sessions", "session's") and issue references
  ("issue 12", "issue #12", "issues 15-17") fail the test, each hit named by file:line. An
  identifier such as ``foo.session`` or ``session_id`` does not count, nor does text inside an
  http(s) address.
- Links: every relative markdown link (``[text](path)``, ``![alt](path)``, ``[ref]: path``,
  ``href=`` / ``src=`` attributes) must name an existing file or folder of the repository, and a
  ``#anchor`` into a markdown file (or a same-file ``#anchor``) must match one of its headings by
  GitHub's slug rules (``slug``, ``anchors``). Links with a scheme (``https:``, ``mailto:``) are
  not checked; neither is text in fenced code blocks or inline code.
"""

import re
from pathlib import Path
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_URL = re.compile(r"\b[a-z][a-z0-9+.-]*://[^\s)>\]]*", re.IGNORECASE)
_SESSION = re.compile(r"(?<![\w.])session(?!_)\w*", re.IGNORECASE)
_ISSUE = re.compile(r"\bissues?\s+#?\d+", re.IGNORECASE)


def _where(path: Path, line: int, root: Path = ROOT) -> str:
  return f"{path.relative_to(root)}:{line}"


def prose_lines(path: Path):
  """(line number, text) of the lines of a markdown file outside fenced code blocks."""
  fence = None
  for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
    m = _FENCE.match(line)
    if fence is None and m:
      fence = m.group(1)
    elif fence is not None:
      if (
        m
        and m.group(1)[0] == fence[0]
        and len(m.group(1)) >= len(fence)
        and not line[m.end() :].strip()
      ):
        fence = None
    else:
      yield n, line


# --- words ------------------------------------------------------------------------------------


def process_words(text: str) -> list[str]:
  """The "session" words and issue references in one line of text (addresses excluded)."""
  text = _URL.sub(" ", text)
  return [m.group(0) for m in (*_SESSION.finditer(text), *_ISSUE.finditer(text))]


def test_process_words_finds_sessions_and_issue_references():
  hits = process_words("Session 5's code, sessions 15-17 and (issue 12), issue #3, Issues 4-5")
  assert hits == ["Session", "sessions", "issue 12", "issue #3", "Issues 4"]
  assert process_words("requests.Session, session_id, https://x.org/session/issues/12") == []
  assert process_words("the issue is the machine; 12 issues") == []


def test_docs_name_no_sessions_and_no_issue_numbers():
  hits = []
  for path in DOCS:  # every line, code blocks included: a comment in a command is read too
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
      for word in process_words(line):
        hits.append(f"{_where(path, n)}: {word!r} in {line.strip()[:100]!r}")
  assert not hits, (
    "process words in the docs (name dates, commits and machines instead):\n" + "\n".join(hits)
  )


# --- headings and anchors -----------------------------------------------------------------------

_HEADING = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")
_IMAGE_OR_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
_HTML_TAG = re.compile(r"<[^>]+>")
_HTML_ID = re.compile(r"""<a\s[^>]*?(?:name|id)=["']([^"']+)["']""", re.IGNORECASE)


def heading_text(markdown: str) -> str:
  """A heading's text as GitHub renders it: code spans' contents, links' texts, no HTML tags, no
  ``_`` emphasis (an underscore inside a word, as in ``snake_case``, stays)."""
  spans = []

  def keep(m):  # code spans first: their contents are literal (no links, no tags)
    spans.append(m.group(2).strip() or m.group(2))
    return f"\x00{len(spans) - 1}\x00"

  text = _CODE_SPAN.sub(keep, markdown)
  text = _IMAGE_OR_LINK.sub(r"\1", text)
  text = _HTML_TAG.sub("", text)
  text = re.sub(r"(?<!\w)_+|_+(?!\w)", "", text)
  return re.sub(r"\x00(\d+)\x00", lambda m: spans[int(m.group(1))], text).strip()


def slug(heading: str) -> str:
  """GitHub's anchor for a heading (github-slugger): the rendered text in lower case, every
  character but letters, digits, ``_``, ``-`` and spaces dropped, each space a hyphen."""
  text = heading_text(heading).lower()
  return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def unique_slugs(headings) -> list[str]:
  """Slugs of headings in document order; a repeated one gets -1, -2, ... as GitHub numbers it."""
  seen, out = {}, []
  for heading in headings:
    base = result = slug(heading)
    while result in seen:
      seen[base] += 1
      result = f"{base}-{seen[base]}"
    seen[result] = 0
    out.append(result)
  return out


def anchors(path: Path) -> set[str]:
  """Every anchor a link into this markdown file may name: headings' slugs and HTML ids."""
  headings, ids = [], set()
  for _, line in prose_lines(path):
    m = _HEADING.match(line)
    if m:
      headings.append(m.group(2) or "")
    ids.update(_HTML_ID.findall(line))
  return set(unique_slugs(headings)) | ids


def test_slug_follows_githubs_rules_on_headings_of_these_docs():
  cases = {
    "One update against PyTorch + transformers on one GPU (`tools/bench_accelerator.py`)": (
      "one-update-against-pytorch--transformers-on-one-gpu-toolsbench_acceleratorpy"
    ),
    "Porting a recipe: verl, TRL and Tunix option names → `rlvr_jax`": (
      "porting-a-recipe-verl-trl-and-tunix-option-names--rlvr_jax"
    ),
    "How `distributed.initialize()` decides (first match wins)": (
      "how-distributedinitialize-decides-first-match-wins"
    ),
    "TPU pod slice (e.g. v5e-32: 8 hosts x 4 chips)": "tpu-pod-slice-eg-v5e-32-8-hosts-x-4-chips",
    "Code sandbox: programs/s before and after hardening (`tools/bench_sandbox.py`)": (
      "code-sandbox-programss-before-and-after-hardening-toolsbench_sandboxpy"
    ),
    "Dr.GRPO against GRPO: the length of wrong answers": (
      "drgrpo-against-grpo-the-length-of-wrong-answers"
    ),
    "Several GPU nodes with SLURM (e.g. 4 nodes x 8 GPUs, one process per node)": (
      "several-gpu-nodes-with-slurm-eg-4-nodes-x-8-gpus-one-process-per-node"
    ),
    "Clip-higher against the symmetric clip: does it keep entropy up?": (
      "clip-higher-against-the-symmetric-clip-does-it-keep-entropy-up"
    ),
    "See [the launch notes](docs/launch.md) and **this**": "see-the-launch-notes-and-this",
    "Ratio ε ≥ 1 − ε_lo": "ratio-ε--1--ε_lo",
    "The _default_ run and `__init__`": "the-default-run-and-__init__",
  }
  for heading, expected in cases.items():
    assert slug(heading) == expected, heading
  assert unique_slugs(["A", "A", "A"]) == ["a", "a-1", "a-2"]
  assert unique_slugs(["A", "A-1", "A"]) == ["a", "a-1", "a-2"]


def test_headings_are_read_outside_code_blocks_only(tmp_path):
  doc = tmp_path / "x.md"
  doc.write_text("# Title\n\n```bash\n# a comment, not a heading\n```\n\n## Title ##\n#not one\n")
  assert anchors(doc) == {"title", "title-1"}


# --- links --------------------------------------------------------------------------------------

_INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+[\"'(][^)]*)?\)")
_REF_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:[ \t]*<?(\S+?)>?(?:\s|$)", re.MULTILINE)
_ATTR = re.compile(r"""\b(?:href|src)=["']([^"']+)["']""", re.IGNORECASE)
_SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)


def links(path: Path):
  """(line number, target) of every link in a markdown file, outside code; a link's text may run
  over several lines."""
  lines = path.read_text(encoding="utf-8").splitlines()
  prose = dict(prose_lines(path))  # fenced lines become empty lines: line numbers stay
  text = "\n".join(_CODE_SPAN.sub("code", prose.get(n, "")) for n in range(1, len(lines) + 1))
  found = []
  for pattern in (_INLINE_LINK, _REF_DEF, _ATTR):
    found += [(m.start(), m.group(1)) for m in pattern.finditer(text)]
  return [(text.count("\n", 0, start) + 1, target) for start, target in sorted(found)]


def broken_links(paths, root: Path = ROOT) -> list[str]:
  """'file:line: (target): what is wrong' for every broken relative link of these files."""
  problems, cache, root = [], {}, root.resolve()
  for path in (p.resolve() for p in paths):
    for n, target in links(path):
      if not target or _SCHEME.match(target):
        continue
      file_part, _, fragment = target.partition("#")
      dest = (path.parent / unquote(file_part)).resolve() if file_part else path
      where = f"{_where(path, n, root)}: ({target})"
      if not dest.exists() or not dest.is_relative_to(root):
        problems.append(f"{where}: no such file in the repository")
        continue
      if not fragment or dest.suffix != ".md":
        continue  # an anchor into a non-markdown file (a line of a source file) is not checked
      if dest not in cache:
        cache[dest] = anchors(dest)
      if unquote(fragment) not in cache[dest]:
        problems.append(f"{where}: no heading of {dest.relative_to(root)} has this anchor")
  return problems


def test_link_checker_on_a_small_tree(tmp_path):
  (tmp_path / "docs").mkdir()
  (tmp_path / "docs" / "b.md").write_text("# B\n## The `x` table (2 seeds)\n")
  (tmp_path / "a.md").write_text(
    "# A\n[ok](docs/b.md#the-x-table-2-seeds) [self](#a) ![img](docs/b.md)\n"
    "[gone](docs/c.md) [bad anchor](docs/b.md#the-x-table) [web](https://x.org/#nope)\n"
    "`[in code](nowhere.md)`\n```\n[in a block](nowhere.md)\n```\n[ref]: docs/missing.md\n"
    "a [link over\ntwo lines](docs/b.md#b) and [another\none](docs/b.md#c)\n"
  )
  assert broken_links([tmp_path / "a.md"], root=tmp_path) == [
    "a.md:3: (docs/c.md): no such file in the repository",
    "a.md:3: (docs/b.md#the-x-table): no heading of docs/b.md has this anchor",
    "a.md:8: (docs/missing.md): no such file in the repository",
    "a.md:10: (docs/b.md#c): no heading of docs/b.md has this anchor",
  ]


def test_docs_links_point_to_existing_files_and_headings():
  problems = broken_links(DOCS)
  assert not problems, "broken links in the docs:\n" + "\n".join(problems)

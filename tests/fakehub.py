"""A small in-memory Hugging Face Hub for upload tests (stdlib only; the Hub's HTTP API as huggingface_hub uses it).

Speaks what huggingface_hub's ``create_repo``, ``create_commit`` / ``upload_folder`` (with
``parent_commit`` and ``create_pr``; the preupload + commit endpoints), ``create_tag``,
``list_repo_refs``, ``dataset_info`` / ``model_info``, ``list_repo_files`` / ``list_repo_tree``,
``list_repo_commits``, ``update_repo_settings`` (``gated``), ``hf_hub_download`` and
``snapshot_download`` need, and the pull-request side of the discussions API
(``get_repo_discussions``, ``get_discussion_details``, ``comment_discussion``,
``merge_pull_request``, ``change_discussion_status``; commits to ``refs/pr/N``). Files are sent inline
("regular" upload mode), so no LFS/xet. A stale ``parentCommit`` is rejected (412), like the Hub.
The eval-results side of the Hub (hub-docs "Evaluation results"): ``model_info(expand=["evalResults"])``
answers the entries of the model's ``.eval_results/*.yaml`` on ``main`` (``{"filename", "data"}``, or
``{"filename", "error"}`` for a file that does not validate), and ``get_dataset_leaderboard`` ranks the
entries for a benchmark dataset (one with ``eval.yaml``) from every model repo's ``main`` and open pull
requests (``pullRequest``: community results), by the first task of its ``eval.yaml``;
``leaderboards[dataset_id] = [...]`` serves a raw payload instead (hostile-response tests).
``gate(repo_type, repo_id, tokens)`` makes a repo gated: its metadata stays readable, file downloads
without one of ``tokens`` get 403 ``GatedRepo`` (as on the Hub).

Accounts: ``FakeHub(users={token: name})``. As on the Hub, ``whoami`` (``/api/whoami-v2``) names the
token's account (401 for an unknown token), and every discussion event and pull request records
its author: the account of the request's token (``anonymous`` without one).
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TYPES = {"models": "model", "datasets": "dataset", "spaces": "space"}


@dataclass
class Commit:
    oid: str
    parent: str | None
    files: dict[str, bytes]
    message: str


@dataclass
class Repo:
    repo_type: str
    repo_id: str
    commits: dict[str, Commit] = field(default_factory=dict)
    refs: dict[str, str] = field(default_factory=dict)   # branch or "refs/pr/N" -> oid
    tags: dict[str, str] = field(default_factory=dict)
    prs: int = 0
    discussions: dict[int, dict] = field(default_factory=dict)
    gated_tokens: set[str] | None = None  # None: not gated
    gated_mode: str | bool = False        # what update_repo_settings(gated=...) set: "auto" | "manual" | False

    def resolve(self, rev: str) -> str | None:
        rev = urllib.parse.unquote(rev)
        if rev in self.refs:
            return self.refs[rev]
        if rev in self.tags:
            return self.tags[rev]
        return rev if rev in self.commits else None


class FakeHub:
    """State + server. Use as a context manager; ``endpoint`` is the base URL."""

    def __init__(self, users: dict[str, str] | None = None) -> None:
        self.users = dict(users or {})  # token -> account name
        self.repos: dict[tuple[str, str], Repo] = {}
        self.lock = threading.Lock()
        self.requests: list[tuple[str, str]] = []
        self.leaderboards: dict[str, object] = {}  # dataset id -> raw leaderboard payload (overrides the computed one)
        handler = type("Handler", (_Handler,), {"hub": self})
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeHub:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def commit(self, repo: Repo, files: dict[str, bytes], deleted: list[str], parent: str | None, message: str,
               branch: str) -> str:
        base = dict(repo.commits[parent].files) if parent else {}
        for p in deleted:
            base.pop(p, None)
        base.update(files)
        oid = hashlib.sha1(json.dumps([parent, message, sorted((p, hashlib.sha256(b).hexdigest())
                                                                for p, b in base.items())]).encode()).hexdigest()
        repo.commits[oid] = Commit(oid, parent, base, message)
        repo.refs[branch] = oid
        return oid

    def gate(self, repo_type: str, repo_id: str, tokens: set[str]) -> None:
        """Gate a repo: downloads need ``Authorization: Bearer <one of tokens>``."""
        self.repos[(repo_type, repo_id)].gated_tokens = set(tokens)

    def create(self, repo_type: str, repo_id: str) -> Repo:
        repo = Repo(repo_type, repo_id)
        self.commit(repo, {".gitattributes": b"*.parquet filter=lfs diff=lfs merge=lfs -text\n"}, [], None,
                    "initial commit", "main")
        self.repos[(repo_type, repo_id)] = repo
        return repo


class _Handler(BaseHTTPRequestHandler):
    hub: FakeHub

    def log_message(self, *args) -> None:  # quiet
        pass

    # -- helpers ---------------------------------------------------------------------------
    def _send(self, code: int, body=None, headers: dict | None = None, raw: bytes | None = None) -> None:
        data = raw if raw is not None else (b"" if body is None else json.dumps(body).encode())
        self.send_response(code)
        self.send_header("Content-Type", "application/octet-stream" if raw is not None else "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _error(self, code: int, kind: str, msg: str) -> None:
        self._send(code, {"error": msg}, {"X-Error-Code": kind, "X-Error-Message": msg})

    def _body(self) -> bytes:
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def _user(self) -> str | None:
        """The account of the request's ``Authorization: Bearer`` token (None: no or unknown token)."""
        auth = self.headers.get("Authorization", "")
        return self.hub.users.get(auth[len("Bearer "):]) if auth.startswith("Bearer ") else None

    def _repo(self, type_plural: str, repo_id: str) -> Repo | None:
        return self.hub.repos.get((TYPES.get(type_plural, ""), repo_id))

    @staticmethod
    def _split_repo(rest: str) -> tuple[str, str]:
        org, name, tail = (rest.split("/", 2) + [""])[:3]
        return f"{org}/{name}", tail

    # -- routes ----------------------------------------------------------------------------
    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        url = urllib.parse.urlparse(self.path)
        path = urllib.parse.unquote(url.path)
        self.hub.requests.append((self.command, path))
        with self.hub.lock:
            if path.startswith("/api/"):
                return self._api_get(path[len("/api/"):], urllib.parse.parse_qs(url.query))
            return self._resolve(path.lstrip("/"))

    def _resolve(self, path: str) -> None:
        type_plural = "models"
        for t in ("datasets", "spaces"):
            if path.startswith(t + "/"):
                type_plural, path = t, path[len(t) + 1:]
        repo_id, tail = self._split_repo(path)
        if not tail.startswith("resolve/"):
            return self._error(404, "EntryNotFound", f"unknown route {path}")
        repo = self._repo(type_plural, repo_id)
        if repo is None:
            return self._error(404, "RepoNotFound", f"repository {repo_id} not found")
        if repo.gated_tokens is not None:
            auth = self.headers.get("Authorization", "")
            if not auth.startswith("Bearer ") or auth[len("Bearer "):] not in repo.gated_tokens:
                return self._error(403, "GatedRepo", f"Access to {repo.repo_type} {repo_id} is restricted. You must "
                                   "have access to it and be authenticated to access it. Please log in.")
        rev_and_file = tail[len("resolve/"):]
        for ref in sorted(list(repo.refs) + list(repo.tags), key=len, reverse=True):
            if rev_and_file.startswith(ref + "/"):
                rev, file = ref, rev_and_file[len(ref) + 1:]
                break
        else:
            rev, _, file = rev_and_file.partition("/")
        oid = repo.resolve(rev)
        if oid is None:
            return self._error(404, "RevisionNotFound", f"revision {rev} not found")
        data = repo.commits[oid].files.get(file)
        if data is None:
            return self._error(404, "EntryNotFound", f"{file} not found")
        etag = '"' + hashlib.sha1(data).hexdigest() + '"'
        self._send(200, raw=data, headers={"X-Repo-Commit": oid, "ETag": etag})

    def _api_get(self, rest: str, query: dict) -> None:
        if rest == "whoami-v2":
            user = self._user()
            if user is None:
                return self._error(401, "Unauthorized", "Invalid credentials in Authorization header")
            return self._send(200, {"type": "user", "name": user, "auth": {"type": "access_token"}})
        type_plural, _, rest = rest.partition("/")
        repo_id, tail = self._split_repo(rest)
        repo = self._repo(type_plural, repo_id)
        if repo is None:
            return self._error(404, "RepoNotFound", f"repository {repo_id} not found")
        if tail == "leaderboard" and repo.repo_type == "dataset":
            return self._leaderboard(repo)
        if tail == "" and "evalResults" in query.get("expand", []):
            items = [{"filename": f, **x} for f, x in _eval_results(repo.commits[repo.refs["main"]].files)]
            return self._send(200, {"id": repo_id, "sha": repo.refs["main"], "evalResults": items})
        if tail == "" or tail.startswith("revision/"):
            rev = tail[len("revision/"):] if tail else "main"  # (already unquoted: refs/pr/N works)
            oid = repo.resolve(rev)
            if oid is None:
                return self._error(404, "RevisionNotFound", f"revision {rev} not found")
            files = repo.commits[oid].files
            return self._send(200, {"id": repo_id, "sha": oid, "private": False, "disabled": False,
                                    "gated": repo.gated_mode,
                                    "siblings": [{"rfilename": p, "size": len(b)} for p, b in sorted(files.items())]})
        if tail.startswith("tree/"):
            rest = tail[len("tree/"):]
            for ref in sorted(list(repo.refs) + list(repo.tags), key=len, reverse=True):
                if rest == ref or rest.startswith(ref + "/"):
                    rev, sub = ref, rest[len(ref) + 1:]
                    break
            else:
                rev, _, sub = rest.partition("/")
            oid = repo.resolve(rev)
            if oid is None:
                return self._error(404, "RevisionNotFound", f"revision {rev} not found")
            entries = [{"type": "file", "path": p, "oid": hashlib.sha1(b).hexdigest(), "size": len(b)}
                       for p, b in sorted(repo.commits[oid].files.items()) if not sub or p.startswith(sub.rstrip("/") + "/")]
            return self._send(200, entries)
        if tail.startswith("commits/"):
            oid = repo.resolve(tail[len("commits/"):])
            if oid is None:
                return self._error(404, "RevisionNotFound", f"revision {tail} not found")
            history = []
            while oid:
                c = repo.commits[oid]
                history.append({"id": oid, "title": c.message, "message": c.message, "authors": [{"user": "tester"}],
                                "date": "2026-01-01T00:00:00.000Z"})
                oid = c.parent
            return self._send(200, history)
        if tail == "discussions":
            items = [self._discussion(repo, n) for n in sorted(repo.discussions, reverse=True)]
            status = (query.get("status") or ["all"])[0]
            kind = (query.get("type") or ["all"])[0]
            items = [d for d in items if status in ("all", d["status"])
                     and kind in ("all", "pull_request" if d["isPullRequest"] else "discussion")]
            return self._send(200, {"discussions": items, "count": len(items), "start": 0,
                                    "numClosedDiscussions": sum(d["status"] != "open" for d in items)})
        if tail.startswith("discussions/"):
            num = int(tail.split("/")[1])
            if num not in repo.discussions:
                return self._error(404, "EntryNotFound", f"discussion {num} not found")
            d = repo.discussions[num]
            return self._send(200, {**self._discussion(repo, num), "events": d.get("events", []),
                                    "changes": {"base": "refs/heads/main",
                                                **({"mergeCommitId": d["merge_commit"]} if d.get("merge_commit") else {})},
                                    "filesWithConflicts": []})
        if tail == "refs":
            return self._send(200, {
                "branches": [{"name": b, "ref": f"refs/heads/{b}", "targetCommit": o} for b, o in repo.refs.items()
                             if not b.startswith("refs/pr/")],
                "tags": [{"name": t, "ref": f"refs/tags/{t}", "targetCommit": o} for t, o in repo.tags.items()],
                "converts": [],
                "pullRequests": [{"name": b, "ref": b, "targetCommit": o} for b, o in repo.refs.items()
                                 if b.startswith("refs/pr/")],
            })
        return self._error(404, "EntryNotFound", f"unknown api route {tail}")

    def _leaderboard(self, repo: Repo) -> None:
        if repo.repo_id in self.hub.leaderboards:
            return self._send(200, self.hub.leaderboards[repo.repo_id])
        import yaml

        spec = repo.commits[repo.refs["main"]].files.get("eval.yaml")
        if spec is None:
            return self._error(404, "EntryNotFound", f"{repo.repo_id} is not a benchmark (no eval.yaml)")
        task = yaml.safe_load(spec)["tasks"][0]["id"]
        rows = []
        for m in (r for r in self.hub.repos.values() if r.repo_type == "model"):
            heads = [(None, m.refs["main"])] + [(int(b.split("/")[-1]), o) for b, o in m.refs.items()
                                                 if b.startswith("refs/pr/") and
                                                 m.discussions.get(int(b.split("/")[-1]), {}).get("status") == "open"]
            for pr, oid in heads:
                for f, x in _eval_results(m.commits[oid].files):
                    d = x.get("data")
                    if d and d["dataset"]["id"] == repo.repo_id and d["dataset"]["task_id"] == task:
                        src = d.get("source") or {}
                        rows.append({"modelId": m.repo_id, "value": d["value"], "filename": f,
                                     "verified": False, "author": {"type": "user", "name": "tester"},
                                     **({"source": {"url": src["url"], "name": src.get("name"), "isExternal": True}}
                                        if src else {}),
                                     **({"pullRequest": pr} if pr else {}),
                                     **({"notes": d["notes"]} if d.get("notes") else {})})
        rows.sort(key=lambda r: -float(r["value"]))
        return self._send(200, [{"rank": i + 1, **r} for i, r in enumerate(rows)])

    def _discussion(self, repo: Repo, num: int) -> dict:
        d = repo.discussions[num]
        return {"num": num, "title": d.get("title", ""), "isPullRequest": d.get("isPullRequest", False),
                "status": d.get("status", "open"), "author": {"name": d.get("author", "tester")},
                "createdAt": "2026-01-01T00:00:00.000Z", "repo": {"name": repo.repo_id, "type": repo.repo_type}}

    def _discussion_post(self, repo: Repo, num: int, action: str, req: dict) -> None:
        d = repo.discussions.get(num)
        if d is None:
            return self._error(404, "EntryNotFound", f"discussion {num} not found")
        events = d.setdefault("events", [])

        def event(kind: str, data: dict) -> dict:
            ev = {"id": f"{num}-{len(events)}", "type": kind, "createdAt": "2026-01-01T00:00:00.000Z",
                  "author": {"name": self._user() or "anonymous"}, "data": data}
            events.append(ev)
            return ev
        if action == "comment":
            ev = event("comment", {"edited": False, "hidden": False, "latest": {"raw": req.get("comment", "")}})
            return self._send(200, {"newMessage": ev})
        if action == "status":
            d["status"] = req.get("status", "open")
            return self._send(200, {"newStatus": event("status-change", {"status": d["status"]})})
        if action == "merge":
            if not d.get("isPullRequest") or d.get("status", "open") != "open":
                return self._error(400, "BadRequest", f"discussion {num} is not an open pull request")
            base, head = repo.commits[d["base"]].files, repo.commits[repo.refs[f"refs/pr/{num}"]].files
            changed = {p: b for p, b in head.items() if base.get(p) != b}
            gone = [p for p in base if p not in head]
            d["merge_commit"] = self.hub.commit(repo, changed, gone, repo.refs["main"], f"Merge PR #{num}", "main")
            d["status"] = "merged"
            if req.get("comment"):
                event("comment", {"edited": False, "hidden": False, "latest": {"raw": req["comment"]}})
            event("status-change", {"status": "merged"})
            return self._send(200, {})
        return self._error(404, "EntryNotFound", f"unknown discussion action {action}")

    def do_PUT(self) -> None:
        path = urllib.parse.unquote(urllib.parse.urlparse(self.path).path)
        self.hub.requests.append(("PUT", path))
        body = json.loads(self._body() or b"{}")
        with self.hub.lock:
            type_plural, _, rest = path[len("/api/"):].partition("/")
            repo_id, tail = self._split_repo(rest)
            repo = self._repo(type_plural, repo_id)
            if not path.startswith("/api/") or repo is None or tail != "settings":
                return self._error(404, "RepoNotFound", f"unknown repo or route {path}")
            if "gated" in body:
                if body["gated"] not in ("auto", "manual", False):
                    return self._error(400, "BadRequest", f"invalid gated value {body['gated']!r}")
                repo.gated_mode = body["gated"]
            return self._send(200, {})

    def do_POST(self) -> None:
        url = urllib.parse.urlparse(self.path)
        path = urllib.parse.unquote(url.path)
        query = urllib.parse.parse_qs(url.query)
        self.hub.requests.append(("POST", path))
        body = self._body()
        with self.hub.lock:
            if path == "/api/validate-yaml":
                return self._send(200, {"errors": [], "warnings": []})
            if path == "/api/repos/create":
                req = json.loads(body or b"{}")
                rtype = req.get("type") or "model"
                repo_id = f"{req['organization']}/{req['name']}" if req.get("organization") else req["name"]
                if (rtype, repo_id) in self.hub.repos:
                    return self._send(409, {"error": "You already created this model repo",
                                            "url": f"{self.hub.endpoint}/{repo_id}"})
                self.hub.create(rtype, repo_id)
                return self._send(200, {"url": f"{self.hub.endpoint}/{repo_id}"})
            if not path.startswith("/api/"):
                return self._error(404, "EntryNotFound", path)
            type_plural, _, rest = path[len("/api/"):].partition("/")
            repo_id, tail = self._split_repo(rest)
            repo = self._repo(type_plural, repo_id)
            if repo is None:
                return self._error(404, "RepoNotFound", f"repository {repo_id} not found")
            if tail.startswith("preupload/"):
                files = json.loads(body)["files"]
                return self._send(200, {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                                                  for f in files]})
            if tail.startswith("commit/"):
                return self._commit(repo, tail[len("commit/"):], body, create_pr=query.get("create_pr", ["0"])[0] in ("1", "true"))
            if tail.startswith("discussions/") and tail.count("/") == 2:
                _, num, action = tail.split("/")
                return self._discussion_post(repo, int(num), action, json.loads(body or b"{}") or {})
            if tail == "discussions":
                req = json.loads(body or b"{}")
                repo.prs += 1
                repo.refs[f"refs/pr/{repo.prs}"] = repo.refs["main"]
                repo.discussions[repo.prs] = {"title": req.get("title", ""), "description": req.get("description", ""),
                                              "isPullRequest": bool(req.get("pullRequest")), "status": "open",
                                              "base": repo.refs["main"], "author": self._user() or "anonymous"}
                return self._send(200, {"num": repo.prs})
            if tail.startswith("tag/"):
                oid = repo.resolve(tail[len("tag/"):])
                tag = json.loads(body)["tag"]
                if oid is None:
                    return self._error(404, "RevisionNotFound", "revision not found")
                if tag in repo.tags:
                    return self._error(409, "TagExists", f"tag {tag} already exists")
                repo.tags[tag] = oid
                return self._send(200, {})
            return self._error(404, "EntryNotFound", f"unknown api route {tail}")

    def _commit(self, repo: Repo, rev: str, body: bytes, *, create_pr: bool) -> None:
        lines = [json.loads(line) for line in body.decode().splitlines() if line.strip()]
        header = next((x["value"] for x in lines if x["key"] == "header"), {})
        branch = urllib.parse.unquote(rev)
        head = repo.resolve(branch)
        if head is None:
            return self._error(404, "RevisionNotFound", f"revision {rev} not found")
        parent = header.get("parentCommit")
        if parent and parent != head:
            return self._error(412, "PreconditionFailed", f"parent commit {parent} is not the head {head} of {branch}")
        files, deleted = {}, []
        for x in lines:
            if x["key"] == "file":
                v = x["value"]
                files[v["path"]] = base64.b64decode(v["content"]) if v.get("encoding", "base64") == "base64" else v["content"].encode()
            elif x["key"] in ("deletedFile", "deletedFolder"):
                deleted.append(x["value"]["path"])
            elif x["key"] == "lfsFile":
                return self._error(400, "BadRequest", "this fake hub only accepts regular (inline) uploads")
        pr_url = None
        if create_pr:  # older clients: commit with ?create_pr=1
            repo.prs += 1
            branch = f"refs/pr/{repo.prs}"
            repo.discussions[repo.prs] = {"title": header.get("summary", ""), "description": "", "isPullRequest": True,
                                          "status": "open", "base": head, "author": self._user() or "anonymous"}
            pr_url = f"{self.hub.endpoint}/{'datasets/' if repo.repo_type == 'dataset' else ''}{repo.repo_id}/discussions/{repo.prs}"
        oid = self.hub.commit(repo, files, deleted, head, header.get("summary", ""), branch)
        self._send(200, {"commitUrl": f"{self.hub.endpoint}/{repo.repo_id}/commit/{oid}", "commitOid": oid,
                         "success": True, "pullRequestUrl": pr_url})


def _eval_results(files: dict[str, bytes]) -> list[tuple[str, dict]]:
    """``(filename, {"data": entry} | {"error": why})`` for each entry of ``.eval_results/*.yaml``, as the Hub
    validates them (a file that is not a list of entries with dataset id, task_id and a numeric value fails)."""
    import yaml

    out = []
    for f, b in sorted(files.items()):
        if not (f.startswith(".eval_results/") and f.endswith((".yaml", ".yml"))):
            continue
        try:
            doc = yaml.safe_load(b)
            ok = isinstance(doc, list) and all(
                isinstance(x, dict) and isinstance(x.get("dataset"), dict) and isinstance(x["dataset"].get("id"), str)
                and isinstance(x["dataset"].get("task_id"), str) and isinstance(x.get("value"), (int, float))
                for x in doc)
        except yaml.YAMLError:
            ok = False
        out += [(f, {"data": x}) for x in doc] if ok else [(f, {"error": "invalid eval results file"})]
    return out

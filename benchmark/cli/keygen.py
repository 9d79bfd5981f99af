"""`bench keygen`: a maintainer's ed25519 signing key for verification stamps."""

from __future__ import annotations

from genshift.cli._common import add_verb


def add_parser(sub):
    p = add_verb(sub, "keygen", help="create a signing key for verification stamps",
                 description="Write a new ed25519 private key to KEY (mode 0600, never overwritten) and its public "
                             "line to KEY.pub, for `bench verify --sign KEY` (docs/leaderboard.md, Signing).",
                 examples="  bench keygen ~/.genshift/maintainer.key --name alice\n"
                          "  cat ~/.genshift/maintainer.key.pub >> trusted-keys.txt\n")
    p.add_argument("key", help="where to write the private key (KEY.pub gets the public line)")
    p.add_argument("--name", default="", help="a name recorded with the public key (default: the file name)")
    return p


def run(args) -> int:
    from genshift.errors import BenchError
    from genshift.eval.stamps import generate_key

    if len(args.name) > 100 or any(not ch.isprintable() for ch in args.name):
        raise BenchError("--name must be at most 100 printable characters")
    pub = generate_key(args.key, name=args.name)
    print(f"private key: {args.key} (keep it secret)")
    print(f"public key:  {args.key}.pub  key id {pub.key_id}")
    print(pub.line())
    return 0

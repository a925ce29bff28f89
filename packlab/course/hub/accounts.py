"""The class list, each attendee's password, and the hub's login that checks them.

A class list is a text file, one person a line: a name, and ``instructor`` after it for
those who run the room (the hub's admins: they see the board and every server)::

    # day 1, room B
    ana
    ben
    chen
    lee instructor

Names are lowercase letters, digits, ``-``, ``_`` or ``.``, starting with a letter or digit
(:data:`NAME`): they name folders and JupyterHub users. :func:`ensure_accounts` gives every
name a random password once, in ``passwords.txt`` (readable by its owner only, for the
instructor to hand out on slips of paper), and keeps only salted scrypt hashes in
``accounts.json``, which the hub's login (:class:`packlab.course.hub.jupyterhub.ClassListAuthenticator`)
reads at every login: adding a
name to the list and running ``make hub`` again adds an account without changing the
others' passwords.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,31}$")
INSTRUCTOR = "instructor"
#: scrypt's cost parameters: about 50 ms per login on a laptop core.
SCRYPT = {"n": 2**14, "r": 8, "p": 1}


class ClassListError(ValueError):
    """A class list that cannot be used; the message names the file, the line and what to do."""


@dataclass(frozen=True)
class Person:
    name: str
    instructor: bool = False


def read_people(path: Path) -> list[Person]:
    """Everyone on the class list at ``path``, in order (see the module docstring for the format)."""
    path = Path(path)
    if not path.is_file():
        raise ClassListError(f"no class list at {path}: write one name a line (and 'NAME instructor' for instructors)")
    people, seen = [], set()
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        words = line.split("#", 1)[0].replace(",", " ").split()
        if not words:
            continue
        name, role = words[0], words[1:]
        if not NAME.match(name):
            raise ClassListError(f"{path}, line {number}: {name!r} is not a usable name: lowercase letters, digits, "
                                 "'-', '_' or '.', starting with a letter or digit, at most 32 characters")
        if role not in ([], [INSTRUCTOR]):
            raise ClassListError(f"{path}, line {number}: after the name only the word {INSTRUCTOR!r} may follow, not {' '.join(role)!r}")
        if name in seen:
            raise ClassListError(f"{path}, line {number}: {name!r} is on the list twice")
        seen.add(name)
        people.append(Person(name, bool(role)))
    if not any(not p.instructor for p in people):
        raise ClassListError(f"{path} names no attendee")
    return people


def read_class_list(path: Path) -> list[str]:
    """The attendees' names (instructors left out): the board's roster."""
    return [p.name for p in read_people(path) if not p.instructor]


def _hash(password: str, salt: bytes) -> str:
    return hashlib.scrypt(password.encode(), salt=salt, dklen=32, **SCRYPT).hex()


def ensure_accounts(people: list[Person], folder: Path) -> tuple[Path, Path]:
    """``folder/passwords.txt`` (plain, owner-only) and ``folder/accounts.json`` (hashes) for ``people``.

    Passwords already given stay; new names get one; names no longer listed lose their
    account. Returns the two files.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    plain_path, accounts_path = folder / "passwords.txt", folder / "accounts.json"
    given = {}
    if plain_path.is_file():
        for line in plain_path.read_text().splitlines():
            words = line.split()
            if len(words) >= 2 and not line.startswith("#"):
                given[words[0]] = words[1]
    plain = {p.name: given.get(p.name) or secrets.token_urlsafe(9) for p in people}
    accounts = {}
    for person in people:
        salt = secrets.token_bytes(16)
        accounts[person.name] = {"salt": salt.hex(), "hash": _hash(plain[person.name], salt), "instructor": person.instructor}
    descriptor = os.open(plain_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as f:
        f.write("# name password (hand each out on its own slip; keep this file to yourself)\n")
        f.writelines(f"{p.name} {plain[p.name]}{'  # instructor' if p.instructor else ''}\n" for p in people)
    os.chmod(plain_path, 0o600)
    partial = accounts_path.with_suffix(".partial")
    partial.write_text(json.dumps(accounts, indent=1))
    os.chmod(partial, 0o600)
    os.replace(partial, accounts_path)
    return plain_path, accounts_path


def verify(accounts: dict, name: str, password: str) -> bool:
    """Whether ``password`` is ``name``'s (constant-time comparison)."""
    entry = accounts.get(name)
    if not entry or not isinstance(password, str):
        return False
    return hmac.compare_digest(_hash(password, bytes.fromhex(entry["salt"])), entry["hash"])

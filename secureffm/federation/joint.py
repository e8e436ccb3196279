"""One aggregation of several message kinds (:meth:`~.channel.Channel.aggregate_many`): the
joint kind that names them, the joint task that asks a client for each one's computation, and
the joint payload whose fields carry each kind's fields under its name.

A joint kind is its parts joined by ``+`` ("gradient+dual_update"): every message, session and
signature of the aggregation is bound to it, so it can be confused with neither part alone.
"""

from __future__ import annotations

from collections.abc import Iterable

from .channel import Task, TaskRefused, Template
from .message import Payload

__all__ = ["SEPARATOR", "JOINT_TASK", "joint_kind", "kind_parts", "is_joint", "joint_task",
           "task_parts", "joint_template", "joint_payload", "split_payload"]

SEPARATOR = "+"
JOINT_TASK = "joint"


def joint_kind(kinds: Iterable[str]) -> str:
    """The kind of one aggregation of ``kinds``, in order."""
    return SEPARATOR.join(kinds)


def kind_parts(kind: str) -> tuple[str, ...]:
    """The kinds a (joint) ``kind`` names, in order; a plain kind names itself."""
    return tuple(kind.split(SEPARATOR))


def is_joint(kind: str) -> bool:
    return SEPARATOR in kind


def joint_task(tasks: dict[str, Task]) -> Task:
    """One task asking for each kind's task, in the order of ``tasks`` (kind -> task)."""
    return Task(JOINT_TASK, {"parts": [[kind, task.name, task.args]
                                       for kind, task in tasks.items()]})


def task_parts(client_id: str, task: object, kind: str) -> dict[str, Task]:
    """kind -> task of a joint ``task`` for the joint ``kind``; TaskRefused unless it is a
    joint task naming exactly the kind's parts, in order, each once (the server chooses the
    task: a part it adds, repeats or leaves out is refused, not computed)."""
    parts = task.args.get("parts") if isinstance(task, Task) else None
    if not (isinstance(task, Task) and task.name == JOINT_TASK and isinstance(parts, list)
            and all(isinstance(p, list) and len(p) == 3 and isinstance(p[1], str)
                    and isinstance(p[2], dict) for p in parts)):
        raise TaskRefused(f"{client_id} refused the joint {kind} aggregation: its computation "
                          f"is not a {JOINT_TASK!r} task of [kind, task, args] parts")
    named = tuple(p[0] for p in parts)
    if named != kind_parts(kind):
        raise TaskRefused(f"{client_id} refused the joint {kind} aggregation: its task names "
                          f"the kinds {list(named)}, not {list(kind_parts(kind))}")
    return {k: Task(name, args) for k, name, args in parts}


def _field(kind: str, name: str) -> str:
    return f"{kind}/{name}"


def joint_template(templates: dict[str, Template]) -> Template:
    """Every kind's template, each field named ``kind/field``."""
    return {_field(kind, name): spec for kind, template in templates.items()
            for name, spec in template.items()}


def joint_payload(payloads: dict[str, Payload]) -> Payload:
    """kind -> payload as one payload of :func:`joint_template`'s fields."""
    return {_field(kind, name): array for kind, payload in payloads.items()
            for name, array in payload.items()}


def split_payload(payload: Payload, templates: dict[str, Template]) -> dict[str, Payload]:
    """The inverse of :func:`joint_payload`: kind -> its fields."""
    return {kind: {name: payload[_field(kind, name)] for name in template}
            for kind, template in templates.items()}

"""What every ``--json`` flag prints: exactly one JSON object on stdout."""
from __future__ import annotations

import json
import math
from typing import Any

import typer


def jsonable(value: Any) -> Any:
    """NaN/inf -> None, numpy scalars and arrays -> Python, tuples -> lists, keys -> str (recursively)."""
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    if hasattr(value, "tolist") and not isinstance(value, (list, dict, str)):
        return jsonable(value.tolist())
    if hasattr(value, "item") and not isinstance(value, (list, dict, str)):
        return jsonable(value.item())
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    return value


def echo_json(obj: dict[str, Any]) -> None:
    """Print ``obj`` as one JSON object (values made JSON-safe; anything else by ``str``)."""
    typer.echo(json.dumps(jsonable(obj), default=str))

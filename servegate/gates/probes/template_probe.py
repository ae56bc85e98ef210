"""Whether the chat template keeps every message, for the contract gate: a template edit that loses the system
message (or any turn) changes every answer while each request still succeeds.

The manifest's template (the tokenizer's own or its file) renders one probe conversation (system, user,
assistant, user), each message a marker no template writes by itself, exactly as a request's messages are
rendered (runtime/preprocess.Preprocessor, so the same sandbox and options); every marker must be in the
prompt. A template that refuses a role (some refuse `system`) is rendered without it, and says which roles it
could not be shown. A tokenizer without a template of its own renders nothing (chat is refused there), so
there is nothing to check. `chat_template: none` joins the messages as plain text, which keeps them all by design.
"""

from __future__ import annotations

from servegate.contracts.errors import ServegateError, ServingError
from servegate.contracts.manifest import ServedModel
from servegate.gates.probes.contract_measure import FieldCheck

PROBE = (
    ("system", "sg-probe-system-5d1e"),
    ("user", "sg-probe-user-a82c"),
    ("assistant", "sg-probe-assistant-37f0"),
    ("user", "sg-probe-user-c91b"),
)
"""(role, content) of the probe conversation: markers no template writes by itself."""
FIELD = "preprocess.chat_template"


def template_problem(rendered: str, probe: tuple[tuple[str, str], ...]) -> str | None:
    """Which probe messages the rendered prompt lost (None: it kept them all)."""
    lost = [f"{role} message {i + 1}" for i, (role, marker) in enumerate(probe) if marker not in rendered]
    return None if not lost else f"the chat template drops the {', '.join(lost)} of a {len(probe)}-message conversation"


def check_template(served: ServedModel) -> FieldCheck | None:
    """The field check of preprocess.chat_template (None where nothing is rendered: embed, or chat_template none)."""
    if served.preprocess.task != "generate" or served.preprocess.chat_template == "none":
        return None
    from servegate.runtime.model.weights import load_tokenizer
    from servegate.runtime.preprocess import Preprocessor

    try:
        tokenizer = load_tokenizer(served)
        preprocessor = Preprocessor(served, tokenizer)
    except ServegateError as exc:
        return FieldCheck(FIELD, "not verified", f"the template could not be loaded: {exc}")
    if preprocessor.template_source is None and getattr(tokenizer, "chat_template", None) is None:
        return None  # no template at all: chat is refused (400), nothing is rendered to lose
    probe: tuple[tuple[str, str], ...] = PROBE
    refused = ""
    for attempt in (PROBE, PROBE[1:]):
        try:
            rendered = preprocessor.render_chat([{"role": r, "content": c} for r, c in attempt])
        except ServingError as exc:
            refused = exc.message
            continue
        probe = attempt
        break
    else:
        return FieldCheck(FIELD, "not verified", f"the template renders no probe conversation: {refused}")
    problem = template_problem(rendered, probe)
    roles = ", ".join(role for role, _ in probe)
    shown = f"{len(probe)} messages ({roles})" + ("; it refuses a system message" if probe is not PROBE else "")
    if problem is not None:
        return FieldCheck(FIELD, "measured", f"rendered {shown}", problem)
    return FieldCheck(FIELD, "measured", f"the prompt keeps every one of {shown}")

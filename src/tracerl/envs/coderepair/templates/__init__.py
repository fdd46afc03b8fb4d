"""Module templates for the code-repair tasks (see `base` for what a template and a bug site
are): `stats`, `text` and `inventory`."""

from tracerl.envs.coderepair.templates.base import BUG_KINDS, Site, Template
from tracerl.envs.coderepair.templates.inventory import INVENTORY
from tracerl.envs.coderepair.templates.stats import STATS
from tracerl.envs.coderepair.templates.text import TEXT

TEMPLATES = {t.name: t for t in (STATS, TEXT, INVENTORY)}

__all__ = ["BUG_KINDS", "TEMPLATES", "Site", "Template"]

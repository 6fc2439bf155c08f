"""Placeholder: being written."""
from dataclasses import dataclass
from typing import ClassVar

from hpcdl.spec import Spec


@dataclass(frozen=True, kw_only=True)
class SpeechSpec(Spec):
    family: ClassVar[str] = "speech"

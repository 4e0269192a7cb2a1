"""Inductor integration: the recording lookup handler and lookup-table export."""

from zhantune.inductor.choices import LookupEvent, RecordingChoices, recording

__all__ = ["LookupEvent", "RecordingChoices", "recording"]

"""Process B: a fresh interpreter answers the approval and resumes the run."""

import sys

from research_flow import research  # noqa: F401 -- the import registers the @flow

from composeai import resume

run = resume(sys.argv[1], answers={"publish": True})
print(f"status: {run.status}")
print(f"output: {run.output}")

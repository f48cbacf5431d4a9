"""All ORM models, one file per table. Importing this package registers every table on Base.metadata."""

from server.models.api_token import SCOPES, ApiToken
from server.models.base import Base
from server.models.capture import CAPTURE_KINDS, CAPTURE_STATES, FINAL_CAPTURE_STATES, Capture
from server.models.framework import JobEvent, JobStep, LayerStat
from server.models.gpu import Gpu
from server.models.gpu_job_hourly import GpuJobHourly
from server.models.gpu_sample import GpuSample
from server.models.ingest_batch import IngestBatch
from server.models.job import JOB_STATES, TERMINAL_STATES, Job
from server.models.job_gpu import JobGpu
from server.models.node import Node
from server.models.plot_view import PlotView
from server.models.process_sample import ProcessSample
from server.models.registered_model import RegisteredModel
from server.models.report import Report
from server.models.rollup import GpuHourly, RollupBacklog
from server.models.trace import Trace

__all__ = [
    "SCOPES", "ApiToken", "Base", "CAPTURE_KINDS", "CAPTURE_STATES", "FINAL_CAPTURE_STATES", "Capture",
    "JobEvent", "JobStep", "LayerStat", "Gpu", "GpuSample", "IngestBatch",
    "JOB_STATES", "TERMINAL_STATES", "Job", "JobGpu", "Node", "PlotView", "ProcessSample", "RegisteredModel", "Report",
    "GpuHourly", "GpuJobHourly", "RollupBacklog",
    "Trace",
]

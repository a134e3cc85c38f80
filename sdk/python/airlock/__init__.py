"""airlock: the Python SDK of airlock's HTTP API (standard library only).

    from airlock import Airlock

    al = Airlock()  # $AIRLOCK_URL, $AIRLOCK_API_KEY
    with al.create(ttl=600) as sb:
        print(sb.exec("echo hi").stdout)
        sb.files.write("data.csv", b"a,b\\n1,2\\n")
        print(sb.run_code("import pandas; pandas.read_csv('data.csv').a.sum()").text)
"""

from ._http import AirlockError
from .client import Airlock, Files, Sandbox
from .types import (CodeContext, CodeError, CodeEvent, CodeResult, ExecEvent, ExecResult, FileInfo, Image, Info,
                    Layer, Limits, MemorySnapshot, Process, TemplateResult, Volume)

__all__ = [
    "Airlock", "AirlockError", "Sandbox", "Files", "CodeContext", "CodeError", "CodeEvent", "CodeResult", "ExecEvent",
    "ExecResult", "FileInfo", "Image", "Info", "Layer", "Limits", "MemorySnapshot", "Process", "TemplateResult",
    "Volume",
]
__version__ = "0.1.0"

"""The SSD link between the target-side worker and the speculator process.

Control messages (`messages`) travel over a ZMQ PAIR socket (`control`); draft tensors over the
link's own torch.distributed group (`tensor_link`); `link` puts both behind one facade per side.
The round protocol is documented in docs/interfaces.md.
"""

from sglang_ssd.transport.control import ControlEndpoint
from sglang_ssd.transport.link import (
    LinkAddress,
    ReceivedDrafts,
    SpeculatorLink,
    TargetLink,
    check_draft_tensors,
    draft_specs,
)
from sglang_ssd.transport.messages import (
    PROTOCOL_VERSION,
    Close,
    Configure,
    ConfigureAck,
    DraftEntry,
    Drafts,
    Error,
    Hello,
    HelloAck,
    Message,
    Open,
    Outcome,
    RemoteError,
    SamplingSpec,
    Shutdown,
    SpeculatorSettings,
    SpeculatorTiming,
    StatsReply,
    StatsRequest,
    Step,
    TransportError,
    TransportTimeout,
    decode,
    encode,
)
from sglang_ssd.transport.tensor_link import TensorLink, TransferStats

__all__ = [
    "PROTOCOL_VERSION",
    "Close",
    "Configure",
    "ConfigureAck",
    "ControlEndpoint",
    "DraftEntry",
    "Drafts",
    "Error",
    "Hello",
    "HelloAck",
    "LinkAddress",
    "Message",
    "Open",
    "Outcome",
    "ReceivedDrafts",
    "RemoteError",
    "SamplingSpec",
    "Shutdown",
    "SpeculatorLink",
    "SpeculatorSettings",
    "SpeculatorTiming",
    "StatsReply",
    "StatsRequest",
    "Step",
    "TargetLink",
    "TensorLink",
    "TransferStats",
    "TransportError",
    "TransportTimeout",
    "check_draft_tensors",
    "decode",
    "draft_specs",
    "encode",
]

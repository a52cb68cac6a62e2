"""The SSD link between the target-side worker and the speculator process.

Control messages (`messages`) travel over a ZMQ PAIR socket (`control`); draft tensors over the
link's own torch.distributed group (`tensor_link`); `link` puts both behind one facade per side.
The round protocol is documented in docs/interfaces.md.
"""

from sglang_ssd.transport.admin_messages import (
    AdminReply,
    AdminRequest,
    decode_admin,
    encode_admin,
)
from sglang_ssd.transport.control import ControlEndpoint
from sglang_ssd.transport.link import (
    LinkAddress,
    ReceivedDrafts,
    SpeculatorLink,
    TargetLink,
    check_draft_tensors,
    draft_specs,
    feature_spec,
)
from sglang_ssd.transport.messages import (
    PROTOCOL_VERSION,
    Close,
    Configure,
    ConfigureAck,
    DraftEntry,
    Drafts,
    DraftSource,
    Error,
    FeatureSpan,
    Hello,
    HelloAck,
    Message,
    Open,
    Outcome,
    SamplingSpec,
    Shutdown,
    SpeculatorStats,
    SpeculatorTiming,
    StatsReply,
    StatsRequest,
    Step,
    decode,
    encode,
)
from sglang_ssd.transport.tensor_link import TensorLink, TransferStats
from sglang_ssd.transport.wire import (
    LiveSettings,
    RemoteError,
    TransportError,
    TransportTimeout,
)

__all__ = [
    "PROTOCOL_VERSION",
    "AdminReply",
    "AdminRequest",
    "Close",
    "Configure",
    "ConfigureAck",
    "ControlEndpoint",
    "DraftEntry",
    "DraftSource",
    "Drafts",
    "Error",
    "FeatureSpan",
    "Hello",
    "HelloAck",
    "LinkAddress",
    "LiveSettings",
    "Message",
    "Open",
    "Outcome",
    "ReceivedDrafts",
    "RemoteError",
    "SamplingSpec",
    "Shutdown",
    "SpeculatorLink",
    "SpeculatorStats",
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
    "decode_admin",
    "draft_specs",
    "encode",
    "encode_admin",
    "feature_spec",
]

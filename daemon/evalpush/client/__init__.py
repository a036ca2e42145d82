"""The platform: credentials, the evaluations API's client over httpx, the lookups it answers, and the retry policy (`retry`) and the gate (`gate`) that ride out its outages."""

from evalpush.client.credentials import (
    DEFAULT_API_BASE,
    DEFAULT_FRONTEND_URL,
    SYSTEMD_CREDENTIAL_NAME,
    Credentials,
    load_credentials,
)
from evalpush.client.exchange import USER_AGENT, RequestObserver
from evalpush.client.gate import Gate
from evalpush.client.lookup import Environments, EvaluationIndex
from evalpush.client.platform import (
    Evaluation,
    PlatformClient,
    is_platform_id,
    most_samples_stored,
)
from evalpush.client.retry import UNUSABLE_ANSWER_ATTEMPTS, Retrier
from evalpush.client.wire import request_deadline

__all__ = [
    "Credentials",
    "DEFAULT_API_BASE",
    "DEFAULT_FRONTEND_URL",
    "Environments",
    "Evaluation",
    "EvaluationIndex",
    "Gate",
    "PlatformClient",
    "RequestObserver",
    "Retrier",
    "SYSTEMD_CREDENTIAL_NAME",
    "UNUSABLE_ANSWER_ATTEMPTS",
    "USER_AGENT",
    "is_platform_id",
    "load_credentials",
    "most_samples_stored",
    "request_deadline",
]

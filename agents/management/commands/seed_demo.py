"""The demo: the seed's ``sds-company-data`` server bound and discovered, the ``company-assistant`` agent with
rules that answer the seed's sample questions, and an admin user. Safe to run again."""

from __future__ import annotations

import secrets
import sys
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from agents.models import Agent, DeterministicRule
from agents.services import agent_create, agent_update, deterministic_rule_create, deterministic_rule_update
from audit.roles import user_create
from mcpregistry.models import McpServer, ToolContract
from mcpregistry.pool import shutdown_default_pool
from mcpregistry.services import mcp_server_create, mcp_server_discover, mcp_server_update, tool_contract_update

DEMO_MCP_ID = "sds-company-data"
DEMO_AGENT = "company-assistant"

SYSTEM_PROMPT = (
    "당신은 삼성SDS 사내 정보 도우미입니다. 직원, 팀, 자산, 프로젝트 질문에 도구로 확인한 사실만으로 답하세요. "
    "도구가 실패하면 그 안내를 따르고, 확인하지 못한 내용은 지어내지 마세요."
)

DEMO_RULES: list[dict[str, Any]] = [
    {
        "name": "직원 소속 조회",
        "order": 10,
        "tool_name": "search_employee",
        "when": {"regex": r"(?P<name>[가-힣]{2,4})\s*님", "any_keywords": ["팀", "소속", "부서", "직무", "이메일"]},
        "params": {"name": "{match.name}"},
        "answer_template": "{result.name} 님은 {result.team} 소속이며, 직무는 {result.role}입니다 (이메일: {result.email}).",
    },
    {
        "name": "팀 인원 조회",
        "order": 20,
        "tool_name": "list_team_members",
        "when": {"regex": r"(?P<team>[가-힣A-Za-z]+팀)", "any_keywords": ["인원", "몇 명", "명단", "구성원", "멤버"]},
        "params": {"team": "{match.team}"},
        "answer_template": "{params.team} 인원은 {result.count}명입니다.",
    },
    {
        "name": "팀 프로젝트 조회",
        "order": 30,
        "tool_name": "list_projects",
        "when": {"regex": r"(?P<team>[가-힣A-Za-z]+팀)", "any_keywords": ["프로젝트"]},
        "params": {"team": "{match.team}"},
        "answer_template": "{params.team}의 진행 중인 프로젝트: {result}",
    },
    {
        "name": "직원 보유 자산 조회",
        "order": 40,
        "tool_name": "get_asset",
        "when": {"regex": r"(?P<owner>[가-힣]{2,4})\s*님", "any_keywords": ["자산", "노트북", "모니터", "장비"]},
        "params": {"owner": "{match.owner}"},
        "answer_template": "{params.owner} 님의 자산은 {result.count}건입니다: {result.assets}",
    },
    {
        "name": "자산 상태 조회",
        "order": 50,
        "tool_name": "get_asset_status",
        "when": {"regex": r"(?P<asset_id>A-\d{4})", "any_keywords": ["상태", "사용", "현황"]},
        "params": {"asset_id": "{match.asset_id}"},
        "answer_template": "{result.asset_id}: {result.status} (사용자: {result.owner})",
    },
]

# Seed 001's failure handling as a contract: timeouts retried at once, rate limits with backoff (2 s, 4 s),
# a wrong answer shape never retried; the model is pointed at the backup tool.
DEMO_CONTRACTS: dict[str, dict[str, Any]] = {
    "get_asset_status": {
        "returns": {"type": "dict", "required": ["asset_id", "status", "owner"]},
        "retry": {
            "max_attempts": 3,
            "on": ["timeout", "rate_limit", "transport"],
            "backoff_base_s": 2.0,
            "backoff_cap_s": 4.0,
        },
        "timeout_s": 2.0,
        "fallback_tool": "get_asset_status_backup",
        "fallback_policy": "suggest",
    },
    "get_asset_status_backup": {"returns": {"type": "str", "non_empty": True}},
}


# The demo server's settings, not secrets (shown, not masked); its INTERNAL_API_KEY is a secret.
DEMO_PUBLIC_ENV = ["FAILURE_MODE", "FAILURE_TIMEOUT_S"]
SEED_ACTOR = "system:seed_demo"
SEED_VIA = "seed_demo"


def apply_demo_contracts(server: McpServer) -> None:
    """The demo's contracts on top of what discovery pre-filled (each change audited): every tool of the demo
    server only reads, which its admin (this command) confirms by marking it ``read`` — discovery proposes
    ``write`` for every tool, whatever the server claims."""
    for contract in ToolContract.objects.filter(tool__server=server).select_related("tool"):
        values = {"risk": ToolContract.Risk.READ, **DEMO_CONTRACTS.get(contract.tool.name, {})}
        tool_contract_update(contract=contract, actor=SEED_ACTOR, via=SEED_VIA, data=values)


class Command(BaseCommand):
    help = "Bind and discover the demo MCP server, create the company-assistant agent with its rules, and an admin."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--admin-username", default=settings.PLATFORM_DEMO_ADMIN_USERNAME)
        parser.add_argument("--no-discover", action="store_true", help="bind the server but do not start it")

    def handle(self, *args: Any, **options: Any) -> None:
        with transaction.atomic():
            server = McpServer.objects.filter(mcp_id=DEMO_MCP_ID).first()
            created = server is None
            binding = {
                # The program is the platform's own interpreter running the shipped server module.
                "command": sys.executable,
                "args": ["-m", settings.PLATFORM_DEMO_SERVER_MODULE],
                "cwd": str(settings.BASE_DIR),
                # The demo server keeps no state between calls: one session per worker, reused across runs.
                "session_scope": McpServer.SessionScope.SHARED,
            }
            if server is None:
                server = mcp_server_create(
                    actor=SEED_ACTOR,
                    via=SEED_VIA,
                    data={
                        "mcp_id": DEMO_MCP_ID,
                        "name": "SDS company data (seed 001 demo)",
                        "transport": McpServer.Transport.STDIO,
                        "env": {"FAILURE_MODE": "none", "INTERNAL_API_KEY": "sk-demo-" + secrets.token_hex(16)},
                        "public_env": DEMO_PUBLIC_ENV,
                        **binding,
                    },
                )
            else:
                mcp_server_update(server=server, actor=SEED_ACTOR, via=SEED_VIA, data=binding)
            agent_values = {
                "name": "회사 정보 도우미 (company assistant)",
                "system_prompt": SYSTEM_PROMPT,
                "model_provider": Agent.Provider.OFFLINE,
                "max_iterations": 6,
            }
            agent = Agent.objects.filter(slug=DEMO_AGENT).first()
            if agent is None:
                agent = agent_create(
                    actor=SEED_ACTOR, via=SEED_VIA, data={"slug": DEMO_AGENT, **agent_values}, servers=[server]
                )
            else:
                agent_update(
                    agent=agent,
                    actor=SEED_ACTOR,
                    via=SEED_VIA,
                    data=agent_values,
                    servers={*agent.servers.all(), server},
                )
            for rule in DEMO_RULES:
                values = {**rule, "server": server}
                existing = DeterministicRule.objects.filter(agent=agent, name=rule["name"]).first()
                if existing is None:
                    deterministic_rule_create(actor=SEED_ACTOR, via=SEED_VIA, data={"agent": agent, **values})
                else:
                    deterministic_rule_update(rule=existing, actor=SEED_ACTOR, via=SEED_VIA, data=values)
            self.stdout.write(
                f"{'bound' if created else 'kept'} MCP server {DEMO_MCP_ID}; agent {DEMO_AGENT} with {len(DEMO_RULES)} rules"
            )
            self._admin(options["admin_username"])
        if options["no_discover"]:
            return
        self.stdout.write(f"discovering {DEMO_MCP_ID} (starts the server once)…")
        try:
            report = mcp_server_discover(server=server, actor=SEED_ACTOR, via=SEED_VIA)
        finally:
            shutdown_default_pool()
        if not report.ok:
            raise CommandError(f"discovery of {DEMO_MCP_ID} failed: {report.error}")
        apply_demo_contracts(server)
        self.stdout.write(self.style.SUCCESS(f"{DEMO_MCP_ID}: {report.tool_count} tools discovered"))

    def _admin(self, username: str) -> None:
        user_model = get_user_model()
        if user_model.objects.filter(username=username).exists():
            self.stdout.write(f"admin user '{username}' exists (password unchanged)")
            return
        password = settings.PLATFORM_DEMO_ADMIN_PASSWORD or secrets.token_urlsafe(12)
        user_create(
            actor=SEED_ACTOR,
            via=SEED_VIA,
            username=username,
            password=password,
            is_staff=True,
            is_superuser=True,
        )
        self.stdout.write(f"admin user: {username}")
        self.stdout.write(f"admin password: {password}")

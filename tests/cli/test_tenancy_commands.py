"""`llmgw orgs|teams|projects|quotas|prices` against the store a server.yaml names."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from click.testing import CliRunner

from llmgw.cli.main import main
from llmgw.store import open_store
from llmgw.store.keys import create_key, revoke_key
from llmgw.store.prices import list_prices
from llmgw.store.quotas import list_budgets, list_limits
from llmgw.store.scopes import load_hierarchy
from llmgw.store.users import create_user, get_user


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "server.yaml"
    path.write_text(
        f"state_dir: {tmp_path / 'state'}\n"
        "models:\n  - name: sim-chat\n    profiles: [{engine: sim}]\n"
        "pricing:\n  sim-chat: {prompt_per_1k: 0.1, completion_per_1k: 0.2}\n"
    )
    return path


@pytest.fixture
def llmgw(config: Path):
    def run(*args: str) -> tuple[int, str, str]:
        result = CliRunner().invoke(main, [*args, "--config", str(config)], catch_exceptions=False)
        return result.exit_code, result.stdout, result.stderr

    return run


def _in_store(config: Path, action):
    async def run():
        async with open_store(config.parent / "state" / "llmgw.db") as store:
            return await action(store)

    return asyncio.run(run())


@pytest.fixture
def acme(llmgw) -> None:
    assert llmgw("orgs", "create", "acme")[0] == 0
    assert llmgw("teams", "create", "core", "--org", "acme")[0] == 0
    assert llmgw("projects", "create", "web", "--team", "core")[0] == 0


class TestHierarchy:
    def test_create_makes_an_org_a_team_in_it_and_a_project_in_that(self, llmgw, acme, config: Path) -> None:
        hierarchy = _in_store(config, load_hierarchy)
        project = next(p for p in hierarchy.projects.values() if p.name == "web")
        chain = hierarchy.chain(project.id)
        assert (chain.team.name, chain.org.name) == ("core", "acme")

    def test_a_name_is_unique_within_its_parent_but_not_across_parents(self, llmgw, acme) -> None:
        code, _, err = llmgw("projects", "create", "web", "--team", "core")
        assert code == 1 and "team 'core' (org 'acme') already has a project called 'web'" in err
        assert llmgw("teams", "create", "core", "--org", "default")[0] == 0
        code, _, err = llmgw("projects", "create", "web", "--team", "core")
        assert code == 1 and "several teams are called 'core'; give the id of one" in err
        assert llmgw("projects", "create", "web", "--team", "3")[0] == 0

    def test_an_id_is_accepted_wherever_a_name_is(self, llmgw, acme) -> None:
        code, out, _ = llmgw("teams", "create", "ops", "--org", "2")
        assert code == 0 and "in org 'acme'" in out
        code, out, _ = llmgw("projects", "rename", "2", "shop")
        assert code == 0 and "is now called 'shop'" in out

    def test_list_shows_each_level_with_its_parents_and_filters_by_parent(self, llmgw, acme) -> None:
        code, out, _ = llmgw("projects", "list")
        assert code == 0 and "web" in out and "core" in out and "acme" in out and "default" in out
        _, out, _ = llmgw("projects", "list", "--team", "core")
        assert "web" in out and "default" not in out
        _, out, _ = llmgw("teams", "list", "--org", "acme")
        assert "core" in out and "default" not in out
        _, out, _ = llmgw("orgs", "list")
        assert "acme" in out and "default" in out

    def test_rename_refuses_a_name_its_parent_already_has(self, llmgw, acme) -> None:
        assert llmgw("projects", "create", "api", "--team", "core")[0] == 0
        code, _, err = llmgw("projects", "rename", "api", "web")
        assert code == 1 and "its team already has a project called 'web'" in err

    def test_delete_refuses_while_live_keys_or_members_remain_and_says_which(
        self, llmgw, acme, config: Path
    ) -> None:
        async def populate(store):
            hierarchy = await load_hierarchy(store)
            web = hierarchy.project_id("web")
            _, key = await create_key(store, "ci", project_id=web)
            await create_user(store, "ana@example.com", "a long password")
            return key

        key = _in_store(config, populate)
        assert llmgw("projects", "members", "add", "web", "ana@example.com")[0] == 0
        code, _, err = llmgw("projects", "delete", "web")
        assert code == 1
        assert f"still has live keys ci ({key.prefix}…)" in err and "members ana@example.com" in err
        _in_store(config, lambda store: revoke_key(store, key.prefix))
        assert llmgw("projects", "members", "remove", "web", "ana@example.com")[0] == 0
        code, _, err = llmgw("teams", "delete", "core")
        assert code == 1 and "still has projects web" in err
        code, out, _ = llmgw("projects", "delete", "web")
        assert code == 0 and "deleted project 'web'" in out
        assert llmgw("teams", "delete", "core")[0] == 0
        assert llmgw("orgs", "delete", "acme")[0] == 0
        assert "acme" not in llmgw("orgs", "list")[1]

    def test_a_deleted_project_takes_its_limits_and_budget_with_it(self, llmgw, acme, config: Path) -> None:
        assert llmgw("quotas", "set", "project:web", "--rpm", "5", "--budget", "2", "--period", "day")[0] == 0
        assert llmgw("projects", "delete", "web")[0] == 0
        assert _in_store(config, list_limits) == [] and _in_store(config, list_budgets) == []

    def test_the_default_project_is_never_deleted(self, llmgw) -> None:
        code, _, err = llmgw("projects", "delete", "default")
        assert code == 1 and "the default project is where keys and accounts go" in err

    def test_a_unicode_digit_is_a_name_that_does_not_exist_not_a_traceback(self, llmgw, acme) -> None:
        """ "³".isdigit() is true and int("³") a ValueError: the command ended in a traceback."""
        code, _, err = llmgw("orgs", "delete", "\u00b3")
        assert code == 1 and "there is no organisation '\u00b3'" in err
        code, _, err = llmgw("keys", "create", "x", "--project", "\u00b2")
        assert code == 1 and "there is no project '\u00b2'" in err

    @pytest.mark.parametrize("digit", ["\u0662", "\uff12", "\u06f2"])
    def test_another_scripts_digit_names_nothing_even_where_its_id_exists(
        self, llmgw, acme, digit: str
    ) -> None:
        """int() reads "٢" and "２" as 2: acme's id, which a check by str.isdecimal or \\d would take."""
        code, _, err = llmgw("orgs", "delete", digit)
        assert code == 1 and f"there is no organisation '{digit}'" in err
        code, _, err = llmgw("quotas", "set", f"team:{digit}", "--rpm", "5")
        assert code == 1 and f"there is no team '{digit}'" in err
        code, _, err = llmgw("projects", "rename", digit, "shop")
        assert code == 1 and f"there is no project '{digit}'" in err
        assert "acme" in llmgw("orgs", "list")[1] and "web" in llmgw("projects", "list")[1]

    def test_a_name_with_a_control_character_is_refused(self, llmgw) -> None:
        code, _, err = llmgw("orgs", "create", "a\x18b")
        assert code == 1 and "control characters" in err

    def test_naming_something_that_does_not_exist_lists_what_does(self, llmgw, acme) -> None:
        code, _, err = llmgw("teams", "create", "x", "--org", "nope")
        assert (
            code == 1
            and "there is no organisation 'nope'; the organisations are 1 (default), 2 (acme)" in err
        )


class TestMembers:
    def test_add_puts_a_pending_account_in_the_project_and_approves_it(
        self, llmgw, acme, config: Path
    ) -> None:
        user = _in_store(config, lambda store: create_user(store, "ana@example.com", "a long password"))
        code, out, _ = llmgw("projects", "members", "add", "web", str(user.id))
        assert code == 0 and "ana@example.com is a member of project 'web'" in out
        after = _in_store(config, lambda store: get_user(store, user.id))
        assert after.status == "active" and after.project_id == 2
        _, out, _ = llmgw("projects", "members", "list", "web")
        assert "ana@example.com" in out and "active" in out

    def test_remove_refuses_an_account_of_another_project(self, llmgw, acme, config: Path) -> None:
        _in_store(config, lambda store: create_user(store, "ana@example.com", "a long password"))
        assert llmgw("projects", "members", "add", "default", "ana@example.com")[0] == 0
        code, _, err = llmgw("projects", "members", "remove", "web", "ana@example.com")
        assert code == 1 and "ana@example.com is not a member of project 'web'" in err

    def test_a_disabled_account_is_not_let_back_in_by_adding_it(self, llmgw, acme, config: Path) -> None:
        async def disabled(store):
            from llmgw.store.users import disable_user

            user = await create_user(store, "ana@example.com", "a long password")
            return await disable_user(store, user.id)

        _in_store(config, disabled)
        code, _, err = llmgw("projects", "members", "add", "web", "ana@example.com")
        assert code == 1 and "is disabled" in err

    def test_an_unknown_account_is_named(self, llmgw, acme) -> None:
        code, _, err = llmgw("projects", "members", "add", "web", "nobody@example.com")
        assert code == 1 and "there is no account 'nobody@example.com'" in err


class TestQuotas:
    def test_set_changes_only_what_is_given_and_list_shows_it(self, llmgw, acme, config: Path) -> None:
        assert llmgw("quotas", "set", "project:web", "--rpm", "60", "--tpm", "1000")[0] == 0
        code, out, _ = llmgw("quotas", "set", "project:web", "--budget", "5", "--period", "week")
        assert code == 0 and "60 rpm, 1000 tpm, a budget of 5 per week" in out
        code, out, _ = llmgw("quotas", "set", "project:web", "--rpm", "10")
        assert "10 rpm, 1000 tpm, a budget of 5 per week" in out
        code, out, _ = llmgw("quotas", "list")
        assert code == 0
        line = next(line for line in out.splitlines() if line.startswith("project:2"))
        assert line.split()[-4:] == ["10", "1000", "5", "week"]

    def test_every_kind_of_scope_is_named_by_name_or_a_key_by_its_prefix(
        self, llmgw, acme, config: Path
    ) -> None:
        _, key = _in_store(config, lambda store: create_key(store, "ci", project_id=2))
        for scope in ("org:acme", "team:core", "project:web", f"key:{key.prefix}…", "org:2"):
            assert llmgw("quotas", "set", scope, "--rpm", "3")[0] == 0, scope
        scopes = {str(limit.scope) for limit in _in_store(config, list_limits)}
        assert scopes == {"org:2", "team:2", "project:2", f"key:{key.id}"}

    def test_a_budget_set_while_a_model_has_no_price_warns_until_it_has_one(
        self, llmgw, config: Path
    ) -> None:
        config.write_text(
            config.read_text().replace(
                "models:\n", "models:\n  - name: free-chat\n    profiles: [{engine: sim}]\n"
            )
        )
        code, _, err = llmgw("quotas", "set", "project:default", "--budget", "5", "--period", "month")
        assert code == 0
        assert "warning: no price applies to free-chat, so budgets never bind on what it serves" in err
        assert llmgw("quotas", "set", "project:default", "--rpm", "5")[2] == ""
        llmgw("prices", "set", "free-chat", "--prompt-per-1k", "0.1", "--completion-per-1k", "0.1")
        code, _, err = llmgw("quotas", "set", "project:default", "--budget", "6")
        assert code == 0 and err == ""

    def test_a_first_budget_needs_its_period(self, llmgw, acme) -> None:
        code, _, err = llmgw("quotas", "set", "project:web", "--budget", "5")
        assert code == 1 and "say how often the budget of project 'web'" in err

    def test_a_bad_scope_or_a_negative_limit_is_refused_saying_why(self, llmgw, acme) -> None:
        code, _, err = llmgw("quotas", "set", "web", "--rpm", "5")
        assert code == 1 and "'web' is not a scope: write org:NAME" in err
        code, _, err = llmgw("quotas", "set", "project:web", "--rpm", "-1")
        assert code == 2 and "rpm is -1; it must be a whole number from 0 to 1,000,000,000,000" in err
        code, _, err = llmgw("quotas", "set", "project:web")
        assert code == 2 and "say what to set" in err

    def test_a_number_past_its_bound_is_a_usage_error_naming_the_bound(self, llmgw, config: Path) -> None:
        """--rpm 100000000000000000000 went on to SQLite and ended in an OverflowError traceback."""
        for option, value, said in (
            ("--rpm", "100000000000000000000", "rpm is 1e+20; it must be a whole number from 0 to 1,000,000"),
            ("--tpm", "1000000000001", "tpm is 1000000000001; it must be a whole number from 0 to 1,0"),
            ("--rpm", "1.5", "rpm is 1.5; write a whole number from 0 to 1,000,000,000,000"),
            ("--budget", "1e13", "the budget is 10000000000000; it must be a number from 0 to 1,000,000,"),
            ("--budget", "inf", "the budget is 'inf'; write a number from 0"),
            ("--budget", "nan", "the budget is 'nan'; write a number from 0"),
            ("--budget", "1e400", "the budget is inf; it must be a number from 0"),
        ):
            code, _, err = llmgw("quotas", "set", "org:default", option, value, "--period", "day")
            assert code == 2 and said in err and "Traceback" not in err, (option, value, err)
        assert _in_store(config, list_limits) == [] and _in_store(config, list_budgets) == []
        code, out, _ = llmgw("quotas", "set", "org:default", "--rpm", "1000000000000", "--tpm", "1e12")
        assert code == 0 and "1000000000000 rpm, 1000000000000 tpm" in out

    def test_clear_removes_the_limits_and_budget(self, llmgw, acme, config: Path) -> None:
        llmgw("quotas", "set", "project:web", "--rpm", "5", "--budget", "1", "--period", "total")
        code, out, _ = llmgw("quotas", "clear", "project:web")
        assert code == 0 and "sets no limit or budget now" in out
        assert _in_store(config, list_limits) == [] and _in_store(config, list_budgets) == []


class TestPrices:
    def test_a_price_set_comes_before_server_yaml_and_list_says_where_each_comes_from(
        self, llmgw, config: Path
    ) -> None:
        _, out, _ = llmgw("prices", "list")
        assert "sim-chat  0.1        0.2            server.yaml pricing" in out
        code, out, _ = llmgw(
            "prices", "set", "sim-chat", "--prompt-per-1k", "1.5", "--completion-per-1k", "3"
        )
        assert code == 0 and "sim-chat costs 1.5 per 1k prompt tokens and 3 per 1k completion tokens" in out
        _, out, _ = llmgw("prices", "list")
        assert "sim-chat  1.5        3              llmgw prices set" in out
        stored = _in_store(config, list_prices)
        assert [(p.model, p.price.prompt_per_1k, p.price.completion_per_1k) for p in stored] == [
            ("sim-chat", 1.5, 3.0)
        ]

    def test_clear_lets_server_yaml_price_the_model_again(self, llmgw) -> None:
        llmgw("prices", "set", "sim-chat", "--prompt-per-1k", "1", "--completion-per-1k", "1")
        code, out, _ = llmgw("prices", "clear", "sim-chat")
        assert code == 0 and "now takes its price from server.yaml pricing" in out
        code, _, err = llmgw("prices", "clear", "sim-chat")
        assert code == 1 and "no price was set for sim-chat" in err

    def test_a_price_for_a_model_not_in_the_catalog_is_kept_with_a_note(self, llmgw) -> None:
        code, _, err = llmgw("prices", "set", "later", "--prompt-per-1k", "1", "--completion-per-1k", "1")
        assert code == 0 and "the catalog has no model later yet" in err
        assert "later" in llmgw("prices", "list")[1]

    def test_a_negative_price_is_refused(self, llmgw) -> None:
        code, _, err = llmgw("prices", "set", "sim-chat", "--prompt-per-1k", "-1", "--completion-per-1k", "1")
        assert code == 2 and "--prompt-per-1k" in err

    def test_a_price_past_its_bound_is_a_usage_error_and_the_bound_itself_is_taken(
        self, llmgw, config: Path
    ) -> None:
        """1e308 was taken, and one long prompt then cost inf."""
        for prompt, completion, said in (
            ("1e308", "1", "the prompt price is 1e+308; it must be a number from 0 to 1,000,000"),
            ("1", "1000000.5", "the completion price is 1000000.5; it must be a number from 0 to 1,000,000"),
            ("nan", "1", "the prompt price is 'nan'; write a number from 0 to 1,000,000"),
            ("\u0661", "1", "the prompt price is '\u0661'; write a number from 0 to 1,000,000"),
        ):
            code, _, err = llmgw(
                "prices", "set", "sim-chat", "--prompt-per-1k", prompt, "--completion-per-1k", completion
            )
            assert code == 2 and said in err, (prompt, err)
        assert _in_store(config, list_prices) == []
        code, _, _ = llmgw(
            "prices", "set", "sim-chat", "--prompt-per-1k", "1000000", "--completion-per-1k", "1e6"
        )
        assert code == 0
        (stored,) = _in_store(config, list_prices)
        assert (stored.price.prompt_per_1k, stored.price.completion_per_1k) == (1e6, 1e6)


class TestProjectModels:
    def test_models_limits_a_project_and_any_lifts_it(self, llmgw, acme, config: Path) -> None:
        code, out, _ = llmgw("projects", "models", "web", "--model", "sim-chat", "--model", "big")
        assert code == 0 and "may call sim-chat, big" in out
        hierarchy = _in_store(config, load_hierarchy)
        assert hierarchy.projects[2].models == ("sim-chat", "big")
        assert "sim-chat, big" in llmgw("projects", "list")[1]
        code, out, _ = llmgw("projects", "models", "web", "--any")
        assert code == 0 and "may call any model" in out
        assert _in_store(config, load_hierarchy).projects[2].models is None

    def test_models_needs_a_model_or_any_but_not_both(self, llmgw, acme) -> None:
        assert llmgw("projects", "models", "web")[0] == 2
        assert llmgw("projects", "models", "web", "--any", "--model", "x")[0] == 2

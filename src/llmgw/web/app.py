"""The pages, mounted on the gateway's client port beside /v1/*.

Plain routes on the gateway's app, with no middleware: a session is looked
up only by the page handlers that need one (require_login, require_admin),
so /v1/* pays nothing for the pages.
"""

from __future__ import annotations

from aiohttp import web

from llmgw.web import account, admin, projects
from llmgw.web.context import WEB_KEY, AdminLink, WebContext, add_admin_links
from llmgw.web.render import load_templates


async def _css(request: web.Request) -> web.StreamResponse:
    ctx = request.config_dict[WEB_KEY]
    await load_templates(ctx)
    return web.Response(
        body=ctx.css, content_type="text/css", charset="utf-8", headers={"Cache-Control": "max-age=3600"}
    )


def mount_sign_in(app: web.Application, ctx: WebContext) -> None:
    """What any app with accounts' pages needs: ctx, /login, /logout and the stylesheet.

    Not the admin listener's: it has no accounts (reaching it is the credential), and its
    pages offer no "Log in" (ACCOUNTS_KEY).
    """
    app[WEB_KEY] = ctx

    async def load(app: web.Application) -> None:
        await load_templates(ctx)

    app.on_startup.append(load)
    routes = app.router
    routes.add_get("/login", account.login_page)
    routes.add_post("/login", account.login)
    routes.add_post("/logout", account.logout)
    routes.add_get("/static/llmgw.css", _css)


def mount_pages(app: web.Application, ctx: WebContext) -> None:
    """Add /, /login, /logout, /signup, /profile, /admin/* and /static/llmgw.css to app."""
    mount_sign_in(app, ctx)
    routes = app.router
    routes.add_get("/", account.root)
    routes.add_get("/signup", account.signup_page)
    routes.add_post("/signup", account.signup)
    routes.add_get("/profile", account.profile)
    routes.add_post("/profile/password", account.change_password)
    routes.add_post("/profile/keys", account.create_own_key)
    routes.add_post(r"/profile/keys/{key_id:\d+}/revoke", account.revoke_own_key)
    routes.add_get("/admin", admin.admin_root)
    routes.add_get("/admin/users", admin.users_page)
    routes.add_post(r"/admin/users/{user_id:\d+}/{action:approve|promote|disable}", admin.user_action)
    routes.add_get("/admin/projects", projects.projects_page)
    routes.add_post(
        r"/admin/projects/{action:create|rename|delete|member-add|member-remove|models}",
        projects.projects_action,
    )
    routes.add_get("/admin/quotas", admin.quotas_page)
    routes.add_post("/admin/quotas", admin.save_quota)
    routes.add_get("/admin/usage", admin.usage_page)
    routes.add_get("/admin/usage.csv", admin.usage_csv)
    add_admin_links(
        app,
        AdminLink("/admin/users", "Users"),
        AdminLink("/admin/projects", "Projects"),
        AdminLink("/admin/quotas", "Quotas"),
        AdminLink("/admin/usage", "Usage"),
    )

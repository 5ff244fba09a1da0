# The submission service on a JupyterHub: add these lines to the hub's jupyterhub_config.py
# (guide/jupyterhub.md, "On JupyterHub"). tests/test_autograder_service_hub.py starts a
# real hub with this very file, so what the guide shows is what is tested.
import sys

c = get_config()  # noqa: F821 (JupyterHub provides it when it loads this file)

NAME = "autograder"                   # the service's name: it is at /services/autograder/
COURSE = "/srv/nbgrader/course101"    # the nbgrader course folder (nbgrader_config.py)
GROUP = "formgrade-course101"         # its instructors: nbgrader's grader group of the course

c.JupyterHub.services = [{
    "name": NAME,
    # where the service listens; the hub's proxy sends /services/autograder/ there
    "url": "http://127.0.0.1:8765",
    # run by the hub (a managed service), which hands it its JUPYTERHUB_* settings
    "command": [sys.executable, "-m", "autograder", "serve", "--jupyterhub"],
    "cwd": COURSE,
    # learners are not asked "authorize autograder to know who you are?" at sign-in
    "oauth_no_confirm": True,
}]
# Every hub user may use the service: a hub user is a learner of the course.
c.JupyterHub.extra_user_scopes = [f"access:services!service={NAME}"]
# The token of each learner's own server (its $JUPYTERHUB_API_TOKEN) may too, so that
# `python -m autograder submit` works in a terminal of that server with no token to copy.
c.Spawner.server_token_scopes = ["users:activity!user", "access:servers!server",
                                 f"access:services!service={NAME}"]
# The instructors: a hub group (the service reads its name from [jupyterhub] of service.toml,
# default formgrade-<course_id>). Add them here, or in the hub's admin page.
c.JupyterHub.load_groups = {GROUP: {"users": ["ada"]}}

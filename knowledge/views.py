from django.contrib.auth.decorators import login_required
from django.shortcuts import render

from knowledge.selectors import workspaces_for_user


@login_required
def home(request):
    workspaces = workspaces_for_user(request.user).order_by("name")
    return render(request, "knowledge/home.html", {"workspaces": workspaces})

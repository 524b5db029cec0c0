"""The ``auditor`` group may view the archive checkpoints (``archive_audit``'s): which events left the table, up to
which seq and into which file, so that an auditor can tell an archived period from one without events."""

from django.db import migrations

AUDITOR_GROUP = "auditor"  # audit.roles.AUDITOR_GROUP (a migration keeps its own copy)
PERMISSION = ("audit", "auditcheckpoint", "view_auditcheckpoint")


def _permission(apps, schema_editor):
    from django.contrib.auth.management import create_permissions

    # Permissions are otherwise created after the whole migrate run (post_migrate): make it exist now.
    app_config = apps.get_app_config("audit")
    app_config.models_module = True
    create_permissions(app_config, apps=apps, verbosity=0, using=schema_editor.connection.alias)
    app_config.models_module = None
    app_label, model, codename = PERMISSION
    return (
        apps.get_model("auth", "Permission")
        .objects.using(schema_editor.connection.alias)
        .get(content_type__app_label=app_label, content_type__model=model, codename=codename)
    )


def _auditor_group(apps, schema_editor):
    Group = apps.get_model("auth", "Group")
    return Group.objects.using(schema_editor.connection.alias).filter(name=AUDITOR_GROUP).first()


def grant(apps, schema_editor):
    group = _auditor_group(apps, schema_editor)
    if group is not None:  # removed by an operator: not made again here
        group.permissions.add(_permission(apps, schema_editor))


def revoke(apps, schema_editor):
    group = _auditor_group(apps, schema_editor)
    if group is not None:
        group.permissions.remove(_permission(apps, schema_editor))


class Migration(migrations.Migration):
    dependencies = [
        ("audit", "0018_alter_configgeneration_options"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [
        migrations.RunPython(grant, revoke),
    ]

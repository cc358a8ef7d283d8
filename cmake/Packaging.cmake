# Install rules and .deb packages for the four programs (issue 7, "Operators' tools";
# docs/packages.md). In a build tree: `cpack -G DEB` makes one package per program:
#
#   sam-box         /usr/bin/sam-box, /usr/bin/sam-box-verify (found beside sam-box),
#                   /lib/systemd/system/sam-box@.service, /etc/default/sam-box
#   nano-init       /usr/bin/nano-init (static: no dependency at all)
#   compass-runner  /usr/bin/compass-runner; Depends on sam-box and nano-init of the same
#                   version (it runs them from beside itself), Recommends podman & co.
#   sam-node        /usr/bin/sam-node, /lib/systemd/system/sam-node.service,
#                   /etc/default/sam-node
#
# each with its bash completion (/usr/share/bash-completion/completions) and its docs and
# examples (/usr/share/doc/PACKAGE). Shared-library dependencies come from dpkg-shlibdeps
# (CPACK_DEBIAN_PACKAGE_SHLIBDEPS), so `dpkg -i` names exactly the libraries a binary links.
# sam-box and sam-node create the system user `compass` their units run as (postinst).
# Sanitizer and fuzzing builds are not packaged.
if(COMPASS_SANITIZE OR COMPASS_FUZZ)
  return()
endif()

include(GNUInstallDirs)
set(compass_deploy ${PROJECT_SOURCE_DIR}/deploy)
set(compass_completions ${CMAKE_INSTALL_DATAROOTDIR}/bash-completion/completions)
set(compass_units /lib/systemd/system)

# compass_package(COMPONENT PACKAGE TARGETS t… DOC page.md [UNIT unit DEFAULTS file]
#                 [EXAMPLES f…]): the install rules of one package and its CPack settings.
function(compass_package component package)
  cmake_parse_arguments(PARSE_ARGV 2 arg "" "DOC;UNIT;DEFAULTS" "TARGETS;EXAMPLES")
  foreach(target IN LISTS arg_TARGETS)
    if(NOT TARGET ${target})
      message(STATUS "packaging: no target ${target}; package ${package} not made")
      return()
    endif()
  endforeach()
  install(TARGETS ${arg_TARGETS} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
          COMPONENT ${component})
  install(FILES ${compass_deploy}/completion/bash/${package}
          DESTINATION ${compass_completions} COMPONENT ${component})
  set(doc ${CMAKE_INSTALL_DATAROOTDIR}/doc/${package})
  install(FILES ${arg_DOC} DESTINATION ${doc} RENAME ${package}.md COMPONENT ${component})
  install(FILES ${PROJECT_SOURCE_DIR}/README.md ${PROJECT_SOURCE_DIR}/docs/packages.md
          DESTINATION ${doc} COMPONENT ${component})
  install(FILES ${PROJECT_SOURCE_DIR}/LICENSE DESTINATION ${doc} RENAME copyright
          COMPONENT ${component})
  if(arg_EXAMPLES)
    install(FILES ${arg_EXAMPLES} DESTINATION ${doc}/examples COMPONENT ${component})
  endif()
  set(extra "")
  if(arg_UNIT)
    install(FILES ${compass_deploy}/systemd/${arg_UNIT} DESTINATION ${compass_units}
            COMPONENT ${component})
    # Maintainer scripts (the `compass` user, unit reloads) and the conffile, per package.
    set(control ${CMAKE_CURRENT_BINARY_DIR}/debian/${package})
    foreach(script postinst prerm postrm)
      configure_file(${compass_deploy}/debian/${script} ${control}/${script} COPYONLY
                     FILE_PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ
                                      GROUP_EXECUTE WORLD_READ WORLD_EXECUTE)
      list(APPEND extra ${control}/${script})
    endforeach()
    file(WRITE ${control}/conffiles "/etc/default/${package}\n")
    list(APPEND extra ${control}/conffiles)
    # Mode 0600: it may hold the values of env:// secrets.
    install(FILES ${compass_deploy}/systemd/${arg_DEFAULTS} DESTINATION /etc/default
            RENAME ${package} PERMISSIONS OWNER_READ OWNER_WRITE COMPONENT ${component})
  endif()
  string(TOUPPER ${component} up)
  set(CPACK_DEBIAN_${up}_PACKAGE_NAME ${package} PARENT_SCOPE)
  set(CPACK_DEBIAN_${up}_PACKAGE_CONTROL_EXTRA "${extra}" PARENT_SCOPE)
  set(CPACK_DEBIAN_${up}_PACKAGE_CONTROL_STRICT_PERMISSION ON PARENT_SCOPE)
  set(compass_components ${compass_components} ${component} PARENT_SCOPE)
endfunction()

set(compass_components "")
compass_package(sam_box sam-box TARGETS sam-box sam-box-verify
                DOC ${PROJECT_SOURCE_DIR}/docs/sam-box.md UNIT sam-box@.service
                DEFAULTS sam-box.default EXAMPLES ${compass_deploy}/systemd/agent.yaml.example)
compass_package(nano_init nano-init TARGETS nano-init
                DOC ${PROJECT_SOURCE_DIR}/src/nano-init/README.md)
compass_package(compass_runner compass-runner TARGETS compass-runner
                DOC ${PROJECT_SOURCE_DIR}/docs/compass-runner.md)
compass_package(sam_node sam-node TARGETS sam-node
                DOC ${PROJECT_SOURCE_DIR}/docs/sam-node.md UNIT sam-node.service
                DEFAULTS sam-node.default
                EXAMPLES ${compass_deploy}/systemd/sam-node.yaml.example
                         ${compass_deploy}/systemd/sam-node-spawn.conf.example)

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME compass-sandbox)
set(CPACK_PACKAGE_VENDOR "Compass sandbox runtime")
set(CPACK_PACKAGE_CONTACT "Compass sandbox maintainers <root@localhost>")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)
set(CPACK_COMPONENTS_ALL ${compass_components})
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_RELEASE 1)
set(CPACK_DEBIAN_PACKAGE_SECTION net)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(compass_deb_version "${PROJECT_VERSION}-${CPACK_DEBIAN_PACKAGE_RELEASE}")

set(CPACK_COMPONENT_SAM_BOX_DESCRIPTION
    "Compass sandbox: sam-box, the per-agent egress boundary
Serves named CONNECT and connect-udp tunnels on a Unix socket and decides each by
the name the agent asked for (default-deny allowlist), forwards mesh.sam.alt to
sam-node with the agent's identity, and exports Prometheus metrics. Runs as
sam-box@AGENT.service.")
set(CPACK_COMPONENT_NANO_INIT_DESCRIPTION
    "Compass sandbox: nano-init, PID 1 of an agent sandbox
A static binary: tun0, a userspace TCP/IP stack and a virtual DNS that turn every
connection of the agent into a named tunnel to its sam-box.")
set(CPACK_COMPONENT_COMPASS_RUNNER_DESCRIPTION
    "Compass sandbox: compass-runner, runs one AI agent per command
Runs an agent on the host, podman or microvm tier, arms its egress (sam-box and
nano-init, or an nftables firewall) before the agent starts, and keeps the roster.")
set(CPACK_COMPONENT_SAM_NODE_DESCRIPTION
    "Compass sandbox: sam-node, models, tools and agents served by name
One per host: OpenAI-compatible models, MCP tools and a2a agents served to each
agent according to its grants; relays spawn and secret-use so agents hold no
credential. Runs as sam-node.service.")
set(CPACK_DEBIAN_COMPASS_RUNNER_PACKAGE_DEPENDS
    "sam-box (= ${compass_deb_version}), nano-init (= ${compass_deb_version})")
set(CPACK_DEBIAN_COMPASS_RUNNER_PACKAGE_RECOMMENDS
    "podman, runc, conmon, uidmap, nftables, debootstrap")
# The microvm tier's programs (its guest kernel is unpacked separately: docs/packages.md).
set(CPACK_DEBIAN_COMPASS_RUNNER_PACKAGE_SUGGESTS
    "qemu-system-x86, busybox-static, erofs-utils, binutils, linux-image-cloud-amd64")
set(CPACK_DEBIAN_SAM_NODE_PACKAGE_SUGGESTS "compass-runner")
set(CPACK_DEBIAN_SAM_BOX_PACKAGE_SUGGESTS "sam-node, nano-init")

include(CPack)

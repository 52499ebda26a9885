# SPDX-License-Identifier: Apache-2.0
# deb.cmake - the Debian packages of `make deb`, made by CPack's DEB generator from
# the build tree `make build` made (cd build && cpack):
#
#   libidem0         libidem.so.0 (the engine and its SQLite and PostgreSQL stores)
#   libidem-client0  libidem-client.so.0 (stable keys, intent journal, retries; over libcurl)
#   libidem-dev      headers, static libraries, the .so links, idem.pc and idem-client.pc
#   idem-tools       the idem CLI, idem-check and provider-sim, with their manual pages
#   orderd           orderd(8), its systemd unit and system user, /etc/idem/orderd.{conf,env}
#   idem-gateway     idem-gateway(8), its systemd unit and system user, /etc/idem/gateway.yaml
#
# Each package is a CPack component made of the install rules below, which name their component
# and are EXCLUDE_FROM_ALL: a plain `cmake --install` does not see them, and the packages do not
# depend on how the rest of the tree's install rules are written.  They always use Debian's layout
# (/usr, multiarch libdir, /etc, /lib/systemd/system, gzip'd manual pages), whatever prefix the
# build tree has.  tests/ops/test_deb.py checks the packages against lintian and installs them.

set(IDEM_DEB_COMPONENTS libidem0 libidem-client0 libidem-dev idem-tools orderd idem-gateway)
set(IDEM_DEB_REVISION 1)
set(IDEM_DEB_VERSION "${PROJECT_VERSION}-${IDEM_DEB_REVISION}")
set(IDEM_DEB_MAINTAINER "idem maintainers <maintainers@idem.invalid>")
if(CMAKE_LIBRARY_ARCHITECTURE)
  set(IDEM_DEB_LIBDIR "lib/${CMAKE_LIBRARY_ARCHITECTURE}")
else()
  set(IDEM_DEB_LIBDIR "lib")
endif()
set(deb_gen ${CMAKE_CURRENT_BINARY_DIR}/deb)
file(MAKE_DIRECTORY ${deb_gen})
find_program(IDEM_GZIP gzip REQUIRED)

# gzip -9n of a file into the build tree (manual pages, changelog: Debian installs them so).
function(idem_deb_gzip src dst)
  execute_process(COMMAND ${IDEM_GZIP} -9n -c ${src} OUTPUT_FILE ${dst} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "gzip ${src} failed")
  endif()
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${src})
endfunction()

# ---- what each package holds --------------------------------------------------------------
macro(deb_install component)
  install(${ARGN} COMPONENT ${component} EXCLUDE_FROM_ALL)
endmacro()

# The shared libraries go to their runtime packages, their .so links to libidem-dev; all four
# targets are exported for find_package(idem CONFIG) (packaging/idemConfig.cmake.in).
deb_install(libidem0 TARGETS idem EXPORT idemDebTargets LIBRARY DESTINATION ${IDEM_DEB_LIBDIR}
            NAMELINK_COMPONENT libidem-dev)
deb_install(libidem-client0 TARGETS idem-client EXPORT idemDebTargets
            LIBRARY DESTINATION ${IDEM_DEB_LIBDIR} NAMELINK_COMPONENT libidem-dev)
deb_install(libidem-dev TARGETS idem_static idem-client_static EXPORT idemDebTargets
            ARCHIVE DESTINATION ${IDEM_DEB_LIBDIR})
deb_install(libidem-dev FILES ${CMAKE_SOURCE_DIR}/include/idem/idem.h
            ${CMAKE_SOURCE_DIR}/include/idem/client.h DESTINATION include/idem)
# The .pc files for the multiarch libdir (the build tree's own follow its prefix).
function(idem_deb_pc_files)
  set(CMAKE_INSTALL_LIBDIR ${IDEM_DEB_LIBDIR})
  set(CMAKE_INSTALL_INCLUDEDIR include)
  file(RELATIVE_PATH IDEM_PC_TO_PREFIX /prefix/${IDEM_DEB_LIBDIR}/pkgconfig /prefix)
  set(IDEM_CLIENT_PC_TO_PREFIX ${IDEM_PC_TO_PREFIX})
  configure_file(${CMAKE_SOURCE_DIR}/cmake/idem.pc.in ${deb_gen}/idem.pc @ONLY)
  configure_file(${CMAKE_SOURCE_DIR}/lib/client/idem-client.pc.in ${deb_gen}/idem-client.pc
                 @ONLY)
endfunction()
idem_deb_pc_files()
deb_install(libidem-dev FILES ${deb_gen}/idem.pc ${deb_gen}/idem-client.pc
            DESTINATION ${IDEM_DEB_LIBDIR}/pkgconfig)
deb_install(libidem-dev EXPORT idemDebTargets NAMESPACE idem:: FILE idemTargets.cmake
            DESTINATION ${IDEM_DEB_LIBDIR}/cmake/idem)
deb_install(libidem-dev FILES ${CMAKE_CURRENT_BINARY_DIR}/idemConfig.cmake
            ${CMAKE_CURRENT_BINARY_DIR}/idemConfigVersion.cmake
            DESTINATION ${IDEM_DEB_LIBDIR}/cmake/idem)

deb_install(idem-tools TARGETS idem_cli idem-check provider-sim RUNTIME DESTINATION bin)
deb_install(orderd TARGETS orderd RUNTIME DESTINATION bin)
deb_install(idem-gateway TARGETS idem-gateway RUNTIME DESTINATION bin)

foreach(page idem.1 idem-check.1 provider-sim.1 orderd.8 idem-gateway.8)
  string(REGEX REPLACE "^(.*)\\.([18])$" "\\1;\\2" parts ${page})
  list(GET parts 0 name)
  list(GET parts 1 section)
  idem_deb_gzip(${CMAKE_SOURCE_DIR}/docs/${page} ${deb_gen}/${page}.gz)
  if(name STREQUAL "orderd" OR name STREQUAL "idem-gateway")
    set(component ${name})
  else()
    set(component idem-tools)
  endif()
  deb_install(${component} FILES ${deb_gen}/${page}.gz DESTINATION share/man/man${section})
endforeach()

foreach(unit orderd idem-gateway)
  deb_install(${unit} FILES ${CMAKE_CURRENT_SOURCE_DIR}/systemd/${unit}.service
              DESTINATION /lib/systemd/system)
  deb_install(${unit} FILES ${CMAKE_CURRENT_SOURCE_DIR}/systemd/${unit}.sysusers
              DESTINATION lib/sysusers.d RENAME ${unit}.conf)
endforeach()
deb_install(orderd FILES ${CMAKE_CURRENT_SOURCE_DIR}/etc/orderd.env DESTINATION /etc/idem
            PERMISSIONS OWNER_READ OWNER_WRITE)
deb_install(orderd FILES ${CMAKE_CURRENT_SOURCE_DIR}/etc/orderd.conf DESTINATION /etc/idem)
deb_install(idem-gateway FILES ${CMAKE_CURRENT_SOURCE_DIR}/etc/gateway.yaml DESTINATION /etc/idem)
deb_install(idem-gateway FILES ${CMAKE_CURRENT_SOURCE_DIR}/etc/gateway.env DESTINATION /etc/idem
            PERMISSIONS OWNER_READ OWNER_WRITE)
deb_install(idem-gateway FILES ${CMAKE_SOURCE_DIR}/examples/gateway.yaml
            DESTINATION share/doc/idem-gateway/examples)
# The API descriptions, and the alert rules, dashboard and HAProxy configuration of docs/ops.md.
deb_install(orderd FILES ${CMAKE_SOURCE_DIR}/docs/openapi/orderd.yaml DESTINATION share/doc/orderd
            RENAME openapi.yaml)
deb_install(orderd FILES ${CMAKE_SOURCE_DIR}/docs/ops/alerts.yml
            ${CMAKE_SOURCE_DIR}/docs/ops/dashboard.json ${CMAKE_SOURCE_DIR}/docs/ops/haproxy.cfg
            DESTINATION share/doc/orderd/ops)
deb_install(idem-gateway FILES ${CMAKE_SOURCE_DIR}/docs/openapi/gateway-admin.yaml
            DESTINATION share/doc/idem-gateway)

# Every package: its copyright and changelog.
configure_file(${CMAKE_CURRENT_SOURCE_DIR}/deb/changelog.in ${deb_gen}/changelog.Debian @ONLY)
idem_deb_gzip(${deb_gen}/changelog.Debian ${deb_gen}/changelog.Debian.gz)
foreach(component ${IDEM_DEB_COMPONENTS})
  deb_install(${component} FILES ${CMAKE_CURRENT_SOURCE_DIR}/deb/copyright
              ${deb_gen}/changelog.Debian.gz DESTINATION share/doc/${component})
endforeach()

# The services' maintainer scripts, and their files in /etc as conffiles.
foreach(unit orderd idem-gateway)
  set(PKG ${unit})
  set(UNIT ${unit})
  if(unit STREQUAL "orderd")
    set(START yes)
    set(conffile "/etc/idem/orderd.conf\n/etc/idem/orderd.env")
  else()
    set(START no) # its config names the upstream: edit it, then enable it (docs/ops.md)
    set(conffile "/etc/idem/gateway.yaml\n/etc/idem/gateway.env")
  endif()
  file(MAKE_DIRECTORY ${deb_gen}/${unit})
  foreach(script postinst prerm postrm)
    configure_file(${CMAKE_CURRENT_SOURCE_DIR}/deb/${script}.in ${deb_gen}/${unit}/${script} @ONLY)
  endforeach()
  file(WRITE ${deb_gen}/${unit}/conffiles "${conffile}\n")
endforeach()

# ---- CPack --------------------------------------------------------------------------------
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME idem)
set(CPACK_PACKAGE_VENDOR "idem")
set(CPACK_RESOURCE_FILE_LICENSE ${PROJECT_SOURCE_DIR}/LICENSE)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "${IDEM_DEB_MAINTAINER}")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_INSTALL_PREFIX /usr) # the prefix of the DESTDIR install CPACK_SET_DESTDIR makes
set(CPACK_SET_DESTDIR ON)
set(CPACK_STRIP_FILES ON)
set(CPACK_COMPONENTS_ALL ${IDEM_DEB_COMPONENTS})
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_RELEASE ${IDEM_DEB_REVISION})
set(CPACK_DEBIAN_PACKAGE_MAINTAINER "${IDEM_DEB_MAINTAINER}")
set(CPACK_DEBIAN_PACKAGE_HOMEPAGE "https://idem.invalid/")
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# shlibs for the two library packages (it is global: the others have no shared object), and
# their ldconfig trigger (packaging/deb/triggers).
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY ">=")
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
set(CPACK_DEBIAN_ENABLE_COMPONENT_DEPENDS ON)

set(long_idem "idem makes write APIs safe to retry, end to end: a retry never becomes a second\norder, a second charge or a second email.")
set(CPACK_DEBIAN_LIBIDEM0_PACKAGE_SECTION libs)
set(CPACK_COMPONENT_LIBIDEM0_DESCRIPTION "idempotency engine for write APIs (shared library)\n${long_idem}\n\nlibidem parses Idempotency-Keys, fingerprints requests (RFC 8785), and keeps\ndurable records with leases and recovery points in SQLite or PostgreSQL.")
set(CPACK_DEBIAN_LIBIDEM0_PACKAGE_CONTROL_EXTRA ${CMAKE_CURRENT_SOURCE_DIR}/deb/triggers)
set(CPACK_DEBIAN_LIBIDEM-CLIENT0_PACKAGE_SECTION libs)
set(CPACK_COMPONENT_LIBIDEM-CLIENT0_DESCRIPTION "retrying HTTP client with stable idempotency keys (shared library)\n${long_idem}\n\nlibidem-client gives every intent one key, journals it before sending, and\nretries with backoff, jitter and Retry-After.")
set(CPACK_DEBIAN_LIBIDEM-CLIENT0_PACKAGE_CONTROL_EXTRA ${CMAKE_CURRENT_SOURCE_DIR}/deb/triggers)
set(CPACK_DEBIAN_LIBIDEM-DEV_PACKAGE_SECTION libdevel)
set(CPACK_COMPONENT_LIBIDEM-DEV_DESCRIPTION "idempotency engine and client for write APIs (development files)\n${long_idem}\n\nThis package has the headers, the static libraries and the pkg-config files\n(idem, idem-client) of libidem and libidem-client.")
set(CPACK_COMPONENT_LIBIDEM-DEV_DEPENDS libidem0 libidem-client0)
set(CPACK_DEBIAN_LIBIDEM-DEV_PACKAGE_DEPENDS
    "libjansson-dev, libsqlite3-dev, libssl-dev, libpq-dev, libcurl4-openssl-dev | libcurl-dev")
set(CPACK_DEBIAN_IDEM-TOOLS_PACKAGE_SECTION utils)
set(CPACK_COMPONENT_IDEM-TOOLS_DESCRIPTION "idempotency tools: idem CLI, idem-check and provider-sim\n${long_idem}\n\nidem sends requests that are safe to retry; idem-check checks an API's\nIdempotency-Key semantics and audits exactly-once under chaos; provider-sim\nsimulates a payment and email provider.")
set(CPACK_DEBIAN_ORDERD_PACKAGE_SECTION net)
set(CPACK_COMPONENT_ORDERD_DESCRIPTION "orders API whose writes are safe to retry\n${long_idem}\n\norderd is idem's reference service: orders charged through a payment\nprovider, emails through an outbox, refunds and webhooks, each exactly once.\nIt runs as a systemd service with its state in /var/lib/orderd.")
set(CPACK_DEBIAN_ORDERD_PACKAGE_CONTROL_EXTRA
    "${deb_gen}/orderd/postinst;${deb_gen}/orderd/prerm;${deb_gen}/orderd/postrm;${deb_gen}/orderd/conffiles")
set(CPACK_DEBIAN_ORDERD_PACKAGE_DEPENDS "adduser")
set(CPACK_DEBIAN_IDEM-GATEWAY_PACKAGE_SECTION net)
set(CPACK_COMPONENT_IDEM-GATEWAY_DESCRIPTION "reverse proxy that makes any HTTP API's writes safe to retry\n${long_idem}\n\nidem-gateway stores the answer of every keyed request and replays it to\nretries, and holds, resends or reconciles when the upstream's outcome is\nunknown. It runs as a systemd service configured in /etc/idem/gateway.yaml.")
set(CPACK_DEBIAN_IDEM-GATEWAY_PACKAGE_CONTROL_EXTRA
    "${deb_gen}/idem-gateway/postinst;${deb_gen}/idem-gateway/prerm;${deb_gen}/idem-gateway/postrm;${deb_gen}/idem-gateway/conffiles")
set(CPACK_DEBIAN_IDEM-GATEWAY_PACKAGE_DEPENDS "adduser")
foreach(component ${IDEM_DEB_COMPONENTS})
  string(TOUPPER ${component} C)
  set(CPACK_DEBIAN_${C}_PACKAGE_NAME ${component})
  set(CPACK_DEBIAN_${C}_FILE_NAME DEB-DEFAULT)
endforeach()
include(CPack)

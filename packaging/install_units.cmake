# SPDX-License-Identifier: Apache-2.0
# install_units.cmake - run by `cmake --install` (packaging/CMakeLists.txt): the systemd units with
# the paths of the install prefix, and the config files of /etc/idem unless they are there
# already (an operator's edits are kept).  IDEM_PACKAGING_DIR is packaging/.
set(prefix "${CMAKE_INSTALL_PREFIX}")
if(prefix STREQUAL "/usr")
  set(etc "/etc")
else()
  set(etc "${prefix}/etc")
endif()
set(dest "$ENV{DESTDIR}")

# The units are written for the Debian layout (/usr/bin, /etc/idem).
foreach(unit orderd.service idem-gateway.service)
  file(READ "${IDEM_PACKAGING_DIR}/systemd/${unit}" text)
  string(REPLACE "/usr/bin/" "${prefix}/bin/" text "${text}")
  string(REPLACE "/etc/idem/" "${etc}/idem/" text "${text}")
  message(STATUS "Installing: ${dest}${prefix}/lib/systemd/system/${unit}")
  file(WRITE "${dest}${prefix}/lib/systemd/system/${unit}" "${text}")
endforeach()

# orderd.env and gateway.env may hold secrets (systemd reads them as root); orderd.conf and gateway.yaml
# hold no secret (JWT keys are files of their own) and the services' users must read them.
function(install_conf name)
  if(EXISTS "${dest}${etc}/idem/${name}")
    message(STATUS "Kept: ${dest}${etc}/idem/${name}")
  else()
    file(INSTALL "${IDEM_PACKAGING_DIR}/etc/${name}" DESTINATION "${dest}${etc}/idem"
         FILE_PERMISSIONS ${ARGN})
  endif()
endfunction()
install_conf(orderd.env OWNER_READ OWNER_WRITE)
install_conf(orderd.conf OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)
install_conf(gateway.yaml OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)
install_conf(gateway.env OWNER_READ OWNER_WRITE)
